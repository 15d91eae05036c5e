// The fused decode kernels of fusion_launch.h on CUDA (what they compute: hybridflow/kernels/decode_fusions.h).
// Plain CUDA, no libtorch; compiled with --fmad=false like decode_kernels.cu, so fp32 products and sums round as
// the CPU references' do.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda_convert.cuh"
#include "kernels/element_math.h"
#include "kernels/fusion_launch.h"

namespace hybridflow::kernels::cuda {
namespace {

constexpr int kFusionWarp = 32;
constexpr int kFusionMaxHeadDim = 256;

// Block (head, row): heads [0, heads) are the row's query heads, [heads, heads + kv_heads) its KV heads. A
// thread per element of the head: the head's norm (the sum of squares reduced as decode_kernels.cu's
// rms_norm_kernel reduces a row of head_dim elements, a warp sum then the warps in order, so the two agree bit
// for bit), then the rotary embedding, reading its partner element half a head away from shared memory; a KV
// head's block writes its key and value at the row's position in the paged pools.
template <typename T>
__global__ void qk_norm_rotary_cache_kernel(QkRotaryCacheWrite a) {
  __shared__ float head[kFusionMaxHeadDim];
  __shared__ float warp_sums[kFusionMaxHeadDim / kFusionWarp];
  const int64_t slot = blockIdx.x, row = blockIdx.y, dim = a.dim;
  const int d = threadIdx.x;
  const bool query = slot < a.heads;
  const int64_t h = query ? slot : slot - a.heads;
  const int64_t source = query ? (row * a.heads + h) * dim : (row * a.kv_heads + h) * dim;
  const T* in = static_cast<const T*>(query ? a.q : a.k) + source;
  const RoundTo<T> round;
  float x = d < dim ? to_float(in[d]) : 0.0f;
  if (a.q_norm != nullptr) {
    float squares = x * x;
    for (int o = kFusionWarp / 2; o > 0; o /= 2) squares += __shfl_xor_sync(0xffffffffu, squares, o);
    if (d % kFusionWarp == 0) warp_sums[d / kFusionWarp] = squares;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < static_cast<int>(blockDim.x) / kFusionWarp; ++w) total += warp_sums[w];
    const float inverse = math::rms_inverse(total, static_cast<int>(dim), a.eps);
    const T* weight = static_cast<const T*>(query ? a.q_norm : a.k_norm);
    if (d < dim) x = math::rms_norm_element(x, inverse, to_float(weight[d]), round);
  }
  if (d < dim) head[d] = x;
  __syncthreads();
  if (d >= dim) return;
  const int64_t half = dim / 2;
  const bool first_half = d < half;
  const float partner = head[first_half ? d + half : d - half];
  const float rotated = math::rotary_element(x, partner, first_half, to_float(static_cast<const T*>(a.cos)[row * dim + d]),
                                             to_float(static_cast<const T*>(a.sin)[row * dim + d]), round);
  if (query) {
    static_cast<T*>(a.q_out)[source + d] = from_float<T>(rotated);
    return;
  }
  const int64_t position = a.lengths[row];
  const int64_t block = a.tables[row * a.width + position / a.block_size];
  const int64_t at = ((block * a.kv_heads + h) * a.block_size + position % a.block_size) * dim + d;
  static_cast<T*>(a.key_pool)[at] = from_float<T>(rotated);
  static_cast<T*>(a.value_pool)[at] = static_cast<const T*>(a.v)[source + d];
}

// Block per row, threads over the table's dims: the angle in fp32 as rotary_cos_sin's multiply, its cosine and
// sine, the optional scaling, one rounding to T.
template <typename T>
__global__ void rotary_tables_kernel(const int64_t* positions, const float* inv_freq, float scaling, bool scaled,
                                     T* cos, T* sin, int64_t dim) {
  const int64_t row = blockIdx.x, half = dim / 2;
  const float position = static_cast<float>(positions[row]);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float angle = position * inv_freq[i % half];
    float c = cosf(angle), s = sinf(angle);
    if (scaled) {
      c = c * scaling;
      s = s * scaling;
    }
    cos[row * dim + i] = from_float<T>(c);
    sin[row * dim + i] = from_float<T>(s);
  }
}

const char* fusion_launched() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace

const char* qk_norm_rotary_cache_write(Dtype dtype, const QkRotaryCacheWrite& args, void* stream) {
  if (args.rows == 0) return nullptr;
  if (args.dim > kFusionMaxHeadDim || args.dim % 2 != 0) return "head_dim must be even and at most 256";
  const dim3 grid(static_cast<unsigned>(args.heads + args.kv_heads), static_cast<unsigned>(args.rows));
  const unsigned threads = static_cast<unsigned>((args.dim + kFusionWarp - 1) / kFusionWarp * kFusionWarp);
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case Dtype::kFloat32: qk_norm_rotary_cache_kernel<float><<<grid, threads, 0, s>>>(args); break;
    case Dtype::kFloat16: qk_norm_rotary_cache_kernel<__half><<<grid, threads, 0, s>>>(args); break;
    case Dtype::kBFloat16: qk_norm_rotary_cache_kernel<__nv_bfloat16><<<grid, threads, 0, s>>>(args); break;
  }
  return fusion_launched();
}

const char* rotary_tables(Dtype dtype, const int64_t* positions, const float* inv_freq, float scaling, bool scaled,
                          void* cos, void* sin, int64_t rows, int64_t dim, void* stream) {
  if (rows == 0 || dim == 0) return nullptr;
  const unsigned threads = static_cast<unsigned>(dim < 256 ? (dim + kFusionWarp - 1) / kFusionWarp * kFusionWarp : 256);
  const auto s = static_cast<cudaStream_t>(stream);
  const auto grid = static_cast<unsigned>(rows);
  switch (dtype) {
    case Dtype::kFloat32:
      rotary_tables_kernel<float><<<grid, threads, 0, s>>>(positions, inv_freq, scaling, scaled,
                                                          static_cast<float*>(cos), static_cast<float*>(sin), dim);
      break;
    case Dtype::kFloat16:
      rotary_tables_kernel<__half><<<grid, threads, 0, s>>>(positions, inv_freq, scaling, scaled,
                                                           static_cast<__half*>(cos), static_cast<__half*>(sin), dim);
      break;
    case Dtype::kBFloat16:
      rotary_tables_kernel<__nv_bfloat16><<<grid, threads, 0, s>>>(positions, inv_freq, scaling, scaled,
                                                                  static_cast<__nv_bfloat16*>(cos),
                                                                  static_cast<__nv_bfloat16*>(sin), dim);
      break;
  }
  return fusion_launched();
}

}  // namespace hybridflow::kernels::cuda
