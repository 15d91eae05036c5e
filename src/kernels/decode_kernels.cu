// The fused decode kernels on CUDA (declared in cuda_launch.h; what they compute: hybridflow/kernels/
// decode_kernels.h). Plain CUDA, no libtorch: the tensor checks and the stream live in decode_kernels.cpp.
// Compiled with --fmad=false, so fp32 products and sums round as the CPU reference's do.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>

#include "kernels/cuda_convert.cuh"
#include "kernels/cuda_launch.h"
#include "kernels/element_math.h"

namespace hybridflow::kernels::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kThreads = 256;
constexpr int kMaxHeadDim = 256;

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The sum of v over the block (every thread gets it); `scratch` holds one float per warp.
__device__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = (blockDim.x + kWarp - 1) / kWarp;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) total += scratch[w];
  __syncthreads();  // scratch is free again for a later call
  return total;
}

// One block per row. With delta, the row's sum is written first and normed from its rounded values.
template <typename T, bool kAdd>
__global__ void rms_norm_kernel(const T* x, const T* delta, const T* weight, T* sum, T* out, int n, float eps) {
  __shared__ float scratch[kThreads / kWarp];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * n;
  const RoundTo<T> round;
  float squares = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float v = to_float(x[base + i]);
    if constexpr (kAdd) {
      v = round(v + to_float(delta[base + i]));
      sum[base + i] = from_float<T>(v);
    }
    squares += v * v;
  }
  const float inverse = math::rms_inverse(block_sum(squares, scratch), n, eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = to_float(kAdd ? sum[base + i] : x[base + i]);
    out[base + i] = from_float<T>(math::rms_norm_element(v, inverse, to_float(weight[i]), round));
  }
}

template <typename T>
__global__ void swiglu_kernel(const T* gate, const T* up, T* out, int64_t count) {
  const RoundTo<T> round;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = from_float<T>(math::swiglu_element(to_float(gate[i]), to_float(up[i]), round));
}

template <typename T>
__global__ void rotary_kernel(const T* x, const T* cos, const T* sin, T* out, int64_t rows, int64_t heads,
                              int64_t dim) {
  const RoundTo<T> round;
  const int64_t count = rows * heads * dim, half = dim / 2;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = i % dim, row = i / (heads * dim);
    const bool first_half = d < half;
    const float partner = to_float(x[first_half ? i + half : i - half]);
    out[i] = from_float<T>(math::rotary_element(to_float(x[i]), partner, first_half, to_float(cos[row * dim + d]),
                                                 to_float(sin[row * dim + d]), round));
  }
}

// Flash-decoding's first pass: block (partition, kv head, row) attends the `group` query heads that share the
// KV head to the positions of one partition, keeping for each its largest score, the sum of exp(score - max)
// and the unnormalised sum of exp(score - max) v. Shared memory: the queries [group][dim], the scores
// [group][partition_size], and the offset of each position's key row in the pools.
template <typename T>
__global__ void paged_attention_partition_kernel(PagedAttention a) {
  extern __shared__ float shared[];
  const int64_t part = blockIdx.x, kv_head = blockIdx.y, row = blockIdx.z;
  const int64_t group = a.heads / a.kv_heads, dim = a.dim, size = a.partition_size;
  float* q_s = shared;
  float* scores = q_s + group * dim;
  int64_t* offsets = reinterpret_cast<int64_t*>(scores + group * size);  // 8-byte aligned: see the launcher
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;

  const int64_t length = a.lengths[row] + 1;
  const int64_t end = length < a.span ? length : a.span;
  const int64_t window_begin = a.sliding_window > 0 ? length - a.sliding_window : 0;
  const int64_t begin = window_begin > 0 ? window_begin : 0;
  const int64_t lo = begin > part * size ? begin : part * size;
  const int64_t hi = end < (part + 1) * size ? end : (part + 1) * size;
  const int64_t first_head = kv_head * group;
  const int64_t stats = (row * a.heads + first_head) * a.partitions + part;  // + g * partitions per query head
  if (lo >= hi) {  // no visible position here (past the row's length, or before its window)
    for (int64_t i = threadIdx.x; i < group * dim; i += blockDim.x) {
      const int64_t g = i / dim;
      a.partial_out[(stats + g * a.partitions) * dim + i % dim] = 0.0f;
      if (i % dim == 0) {
        a.partial_max[stats + g * a.partitions] = -FLT_MAX;
        a.partial_sum[stats + g * a.partitions] = 0.0f;
      }
    }
    return;
  }
  const int64_t n = hi - lo;
  const T* q = static_cast<const T*>(a.q) + (row * a.heads + first_head) * dim;
  for (int64_t i = threadIdx.x; i < group * dim; i += blockDim.x) q_s[i] = to_float(q[i]);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const int64_t p = lo + j;
    const int64_t block = a.tables[row * a.width + p / a.block_size];
    offsets[j] = ((block * a.kv_heads + kv_head) * a.block_size + p % a.block_size) * dim;
  }
  __syncthreads();

  // Scores: a warp per position, each lane holding dims lane, lane + 32, ... of the key.
  const T* keys = static_cast<const T*>(a.key_pool);
  for (int64_t j = warp; j < n; j += warps) {
    float k[kMaxHeadDim / kWarp];
#pragma unroll
    for (int c = 0; c < kMaxHeadDim / kWarp; ++c) {
      const int64_t d = lane + c * kWarp;
      k[c] = d < dim ? to_float(keys[offsets[j] + d]) : 0.0f;
    }
    for (int64_t g = 0; g < group; ++g) {
      float dot = 0.0f;
#pragma unroll
      for (int c = 0; c < kMaxHeadDim / kWarp; ++c) {
        const int64_t d = lane + c * kWarp;
        if (d < dim) dot += q_s[g * dim + d] * k[c];
      }
      dot = warp_sum(dot);
      if (lane == 0) scores[g * size + j] = dot * a.scale;
    }
  }
  __syncthreads();

  // Each query head's largest score and exp(score - max) in place, a warp per head.
  for (int64_t g = warp; g < group; g += warps) {
    float m = -FLT_MAX;
    for (int64_t j = lane; j < n; j += kWarp) m = fmaxf(m, scores[g * size + j]);
    m = warp_max(m);
    float s = 0.0f;
    for (int64_t j = lane; j < n; j += kWarp) {
      const float e = expf(scores[g * size + j] - m);
      scores[g * size + j] = e;
      s += e;
    }
    s = warp_sum(s);
    if (lane == 0) {
      a.partial_max[stats + g * a.partitions] = m;
      a.partial_sum[stats + g * a.partitions] = s;
    }
  }
  __syncthreads();

  // The weighted values: a thread per (query head, dim), consecutive threads reading consecutive dims.
  const T* values = static_cast<const T*>(a.value_pool);
  for (int64_t i = threadIdx.x; i < group * dim; i += blockDim.x) {
    const int64_t g = i / dim, d = i % dim;
    float acc = 0.0f;
    for (int64_t j = 0; j < n; ++j) acc += scores[g * size + j] * to_float(values[offsets[j] + d]);
    a.partial_out[(stats + g * a.partitions) * dim + d] = acc;
  }
}

// The second pass: block (query head, row) rescales its partitions to the largest maximum and normalises.
template <typename T>
__global__ void paged_attention_reduce_kernel(PagedAttention a) {
  const int64_t head = blockIdx.x, row = blockIdx.y, dim = a.dim;
  const int64_t stats = (row * a.heads + head) * a.partitions;
  float m = -FLT_MAX;
  for (int64_t p = 0; p < a.partitions; ++p)
    if (a.partial_sum[stats + p] > 0.0f) m = fmaxf(m, a.partial_max[stats + p]);
  float total = 0.0f;
  for (int64_t p = 0; p < a.partitions; ++p)
    if (a.partial_sum[stats + p] > 0.0f) total += a.partial_sum[stats + p] * expf(a.partial_max[stats + p] - m);
  T* out = static_cast<T*>(a.out) + (row * a.heads + head) * dim;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t p = 0; p < a.partitions; ++p)
      if (a.partial_sum[stats + p] > 0.0f) acc += expf(a.partial_max[stats + p] - m) * a.partial_out[(stats + p) * dim + d];
    out[d] = from_float<T>(acc / total);
  }
}

const char* launched() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

unsigned grid_for(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

template <typename T>
const char* rms_norm_typed(const void* x, const void* delta, const void* weight, void* sum, void* out, int64_t rows,
                           int64_t n, float eps, cudaStream_t stream) {
  const int threads = n >= kThreads ? kThreads : static_cast<int>((n + kWarp - 1) / kWarp * kWarp);
  if (delta != nullptr)
    rms_norm_kernel<T, true><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(delta), static_cast<const T*>(weight), static_cast<T*>(sum),
        static_cast<T*>(out), static_cast<int>(n), eps);
  else
    rms_norm_kernel<T, false><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
        static_cast<const T*>(x), nullptr, static_cast<const T*>(weight), nullptr, static_cast<T*>(out),
        static_cast<int>(n), eps);
  return launched();
}

template <typename T>
const char* paged_attention_typed(const PagedAttention& a, cudaStream_t stream) {
  // The offsets follow group * (dim + partition_size) floats, an even count (both even): 8-byte aligned.
  const int64_t group = a.heads / a.kv_heads;
  const size_t bytes = static_cast<size_t>(group * (a.dim + a.partition_size)) * sizeof(float) +
                       static_cast<size_t>(a.partition_size) * sizeof(int64_t);
  const dim3 parts(static_cast<unsigned>(a.partitions), static_cast<unsigned>(a.kv_heads),
                   static_cast<unsigned>(a.rows));
  paged_attention_partition_kernel<T><<<parts, 128, bytes, stream>>>(a);
  if (const char* e = launched()) return e;
  paged_attention_reduce_kernel<T>
      <<<dim3(static_cast<unsigned>(a.heads), static_cast<unsigned>(a.rows)), 64, 0, stream>>>(a);
  return launched();
}

template <typename F>
const char* by_dtype(Dtype dtype, F&& f) {
  switch (dtype) {
    case Dtype::kFloat32: return f(float{});
    case Dtype::kFloat16: return f(__half{});
    case Dtype::kBFloat16: return f(__nv_bfloat16{});
  }
  return "unknown dtype";
}

}  // namespace

const char* rms_norm(Dtype dtype, const void* x, const void* delta, const void* weight, void* sum, void* out,
                     int64_t rows, int64_t n, float eps, void* stream) {
  if (rows == 0 || n == 0) return nullptr;
  return by_dtype(dtype, [&](auto t) {
    return rms_norm_typed<decltype(t)>(x, delta, weight, sum, out, rows, n, eps, static_cast<cudaStream_t>(stream));
  });
}

const char* swiglu(Dtype dtype, const void* gate, const void* up, void* out, int64_t count, void* stream) {
  if (count == 0) return nullptr;
  return by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    swiglu_kernel<T><<<grid_for(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(out), count);
    return launched();
  });
}

const char* rotary(Dtype dtype, const void* x, const void* cos, const void* sin, void* out, int64_t rows,
                   int64_t heads, int64_t dim, void* stream) {
  const int64_t count = rows * heads * dim;
  if (count == 0) return nullptr;
  return by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    rotary_kernel<T><<<grid_for(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(x), static_cast<const T*>(cos), static_cast<const T*>(sin), static_cast<T*>(out), rows,
        heads, dim);
    return launched();
  });
}

const char* paged_decode_attention(Dtype dtype, const PagedAttention& args, void* stream) {
  if (args.rows == 0) return nullptr;
  return by_dtype(dtype, [&](auto t) {
    return paged_attention_typed<decltype(t)>(args, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace hybridflow::kernels::cuda
