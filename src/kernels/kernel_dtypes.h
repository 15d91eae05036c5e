// The dtypes the fused kernels take, as their CPU references read and round them and as their CUDA launchers name them;
// shared by the kernels' dispatch files (decode_kernels.cpp, decode_fusions.cpp, few_rows_linear.cpp).
#pragma once

#include <torch/torch.h>

#ifdef HF_WITH_CUDA
#include "kernels/cuda_launch.h"
#endif

namespace hybridflow::kernels::detail {

// Whether the kernels take tensors of this dtype: float32, float16 or bfloat16.
inline bool kernel_dtype(torch::ScalarType t) {
  return t == torch::kFloat32 || t == torch::kFloat16 || t == torch::kBFloat16;
}

// A float32 contiguous copy (or the tensor itself) that the CPU references' loops read.
inline torch::Tensor float_copy(const torch::Tensor& t) { return t.to(torch::kFloat32).contiguous(); }

// Calls f with a function that rounds a float to the nearest value of t (round to nearest even, as the CUDA
// conversions do); for float32 the identity.
template <typename F>
void with_reference_rounding(torch::ScalarType t, F&& f) {
  if (t == torch::kBFloat16)
    f([](float v) { return static_cast<float>(c10::BFloat16(v)); });
  else if (t == torch::kHalf)
    f([](float v) { return static_cast<float>(c10::Half(v)); });
  else
    f([](float v) { return v; });
}

#ifdef HF_WITH_CUDA
// The CUDA launchers' name for a float32, float16 or bfloat16 tensor's dtype.
inline cuda::Dtype cuda_dtype_of(torch::ScalarType t) {
  return t == torch::kBFloat16 ? cuda::Dtype::kBFloat16 : t == torch::kHalf ? cuda::Dtype::kFloat16 : cuda::Dtype::kFloat32;
}
#endif

}  // namespace hybridflow::kernels::detail
