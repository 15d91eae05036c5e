// The per-element arithmetic of the fused decode kernels, shared by the CUDA kernels (decode_kernels.cu) and
// their CPU references (decode_kernels.cpp), so both compute the same operations in the same order. `round`
// maps a float to the nearest value of the storage dtype (the identity for fp32): the fused kernels round
// where the unfused operators store an intermediate tensor, so they agree with them to the last bit apart
// from reductions and transcendental functions.
#pragma once

#include <cmath>

#ifdef __CUDACC__
#define HF_KERNEL_MATH __host__ __device__ __forceinline__
#else
#define HF_KERNEL_MATH inline
#endif

namespace hybridflow::kernels::math {

// 1 / sqrt(mean(x^2) + eps) from the sum of squares of n elements (torch's rsqrt: a correctly rounded
// division of a correctly rounded square root).
HF_KERNEL_MATH float rms_inverse(float sum_squares, int n, float eps) {
  return 1.0f / sqrtf(sum_squares / static_cast<float>(n) + eps);
}

// weight * (x * inverse rounded to the dtype), rounded.
template <typename Round>
HF_KERNEL_MATH float rms_norm_element(float x, float inverse, float weight, Round round) {
  return round(weight * round(x * inverse));
}

// silu(gate) rounded, times up, rounded.
template <typename Round>
HF_KERNEL_MATH float swiglu_element(float gate, float up, Round round) {
  return round(round(gate / (1.0f + expf(-gate))) * up);
}

// One element of x * cos + rotate_half(x) * sin: `partner` is x's element half a head away, negated when
// this element is in the first half.
template <typename Round>
HF_KERNEL_MATH float rotary_element(float x, float partner, bool first_half, float cos, float sin, Round round) {
  const float rotated = first_half ? -partner : partner;
  return round(round(x * cos) + round(rotated * sin));
}

}  // namespace hybridflow::kernels::math
