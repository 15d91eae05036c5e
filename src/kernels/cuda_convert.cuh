// Conversions between the storage dtypes of the CUDA decode kernels (fp32, fp16, bf16) and the fp32 they compute
// in, shared by decode_kernels.cu, paged_attention_v2.cu and decode_fusions.cu. Round to nearest even, as c10's
// on the CPU.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace hybridflow::kernels::cuda {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Rounds a float to the nearest value of T (round to nearest even, as c10's conversions on the CPU).
template <typename T>
struct RoundTo {
  __device__ __forceinline__ float operator()(float x) const { return to_float(from_float<T>(x)); }
};

}  // namespace hybridflow::kernels::cuda
