// Loads and stores of the CUDA kernels' storage dtypes (fp32, fp16, bf16) through float, and the rounding of a
// float to the nearest value of a dtype (round to nearest even, as c10's conversions on the CPU). For .cu files
// only (nvcc); decode_fusions.cu uses it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace hybridflow::kernels::cuda::element_io {

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

template <typename T>
struct RoundTo {
  __device__ __forceinline__ float operator()(float x) const { return to_float(from_float<T>(x)); }
};

}  // namespace hybridflow::kernels::cuda::element_io
