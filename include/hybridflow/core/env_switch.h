// An on/off switch read from the environment, for the kernels and paths a run may turn off to measure one
// against the other (HF_DECODE_KERNELS, HF_DECODE_GEMV, HF_FUSED_RMS_NORM).
#pragma once

namespace hybridflow {

// `name`'s value: on or 1 -> true; off or 0 -> false; unset or empty -> `unset`. Anything else is an error
// naming the variable and `what` it switches, rather than a silent default.
bool env_switch(const char* name, bool unset, const char* what);

}  // namespace hybridflow
