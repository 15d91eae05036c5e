// Internal to trainer/: verl's batch-size keys as rows per process. verl's semantics: ppo_mini_batch_size
// counts prompts over all data-parallel ranks (x rollout.n samples); a micro-batch key `<name>` counts samples
// over all ranks and `<name>_per_gpu` samples per process (one of the two, never both).
#pragma once

#include <cstdint>
#include <string>

#include "hybridflow/core/config.h"

namespace hybridflow {

// Samples per process per optimizer step of the role whose ppo_mini_batch_size is `key`, over `dp` ranks.
int64_t mini_batch_rows_per_process(const Config& config, const std::string& key, int64_t n, int dp);

// Samples per process per forward (and backward) from `key` (global) or `key`_per_gpu; `fallback` when
// both are null. Errors name both keys and numbers.
int64_t micro_batch_rows_per_process(const Config& config, const std::string& key, int dp, int64_t fallback);

// A micro-batch must split the mini-batch evenly (verl asserts the same); the error names both keys.
void check_micro_divides_mini(int64_t mini_rows, int64_t micro_rows, const std::string& mini_key,
                              const std::string& micro_key);

}  // namespace hybridflow
