// The batch-invariant kernels on CUDA (declared in batch_invariant_launch.h; the contract:
// hybridflow/kernels/batch_invariant_kernels.h). Every reduction has one order fixed by the code and by the
// length it reduces over (in, n, head_dim, the visible keys, vocab), never by the number of rows, a row's
// place among them, or the grid: no split-K, no atomics, no library GEMM. Block and warp sizes are constants,
// so a warp's butterfly and a block's sum of its warps are the same tree for every launch.
// Compiled with --fmad=false: a product and a sum round apart unless the code asks for fmaf.
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/batch_invariant_launch.h"

namespace hybridflow::kernels::cuda::invariant {
namespace {

constexpr int kWarp = 32;
constexpr int kRowThreads = 256;  // one block per row for norms and log-probs: 8 warps, always
constexpr int kMaxDimPerLane = 8;  // head_dim up to 256 in a warp's registers

// The butterfly over a warp with `op` (a sum or a maximum): after it every lane holds the same bits (op is
// commutative), from a tree fixed by the warp size.
struct BiPlus {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct BiMax {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename T, typename Op>
__device__ __forceinline__ T bi_warp_reduce(T v, Op op) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float bi_warp_sum(float v) { return bi_warp_reduce(v, BiPlus{}); }

// The same over a kRowThreads block: each warp's butterfly, then the warps' results in warp order.
template <typename T, typename Op>
__device__ T bi_block_reduce(T v, T* scratch, Op op) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = bi_warp_reduce(v, op);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T total = scratch[0];
  for (int w = 1; w < kRowThreads / kWarp; ++w) total = op(total, scratch[w]);
  __syncthreads();
  return total;
}

const char* bi_launched() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

int64_t bi_blocks(int64_t count, int threads) {
  const int64_t b = (count + threads - 1) / threads;
  return b < 65535 * 8 ? (b > 0 ? b : 1) : 65535 * 8;  // grid-stride loops cover the rest
}

// ---- matrix product -------------------------------------------------------------------------------------
// A 64 x 64 tile of [rows, out] per block of 16 x 16 threads, each thread 4 rows x 4 outputs with one
// accumulator each: acc = fmaf(x[k], w[k], acc) for k = 0, 1, ..., in - 1 in order, staged through shared
// memory 16 k at a time. Which tile or thread holds an element changes nothing about its sum.
constexpr int kTile = 64, kTileK = 16, kSide = 16, kPerThread = kTile / kSide;

__global__ void bi_linear_kernel(const float* x, const float* w, const float* bias, float* y, int64_t rows,
                                 int64_t in, int64_t out) {
  __shared__ float xs[kTileK][kTile + 1];
  __shared__ float ws[kTileK][kTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * kSide + tx;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile, out0 = static_cast<int64_t>(blockIdx.x) * kTile;
  float acc[kPerThread][kPerThread] = {};
  for (int64_t k0 = 0; k0 < in; k0 += kTileK) {
    // 1024 elements of each operand, 4 per thread, consecutive threads reading consecutive k.
    for (int l = 0; l < kTile * kTileK / (kSide * kSide); ++l) {
      const int idx = tid + l * kSide * kSide, m = idx / kTileK, kk = idx % kTileK;
      const int64_t k = k0 + kk, r = row0 + m, o = out0 + m;
      xs[kk][m] = (r < rows && k < in) ? x[r * in + k] : 0.0f;
      ws[kk][m] = (o < out && k < in) ? w[o * in + k] : 0.0f;
    }
    __syncthreads();
    const int kk_end = in - k0 < kTileK ? static_cast<int>(in - k0) : kTileK;  // no padded terms in the sum
    for (int kk = 0; kk < kk_end; ++kk)
#pragma unroll
      for (int i = 0; i < kPerThread; ++i)
#pragma unroll
        for (int j = 0; j < kPerThread; ++j) acc[i][j] = fmaf(xs[kk][ty + i * kSide], ws[kk][tx + j * kSide], acc[i][j]);
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kPerThread; ++i)
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int64_t r = row0 + ty + i * kSide, o = out0 + tx + j * kSide;
      if (r < rows && o < out) y[r * out + o] = bias != nullptr ? acc[i][j] + bias[o] : acc[i][j];
    }
}

// ---- RMSNorm ---------------------------------------------------------------------------------------------
// A block per row: thread i sums the squares of elements i, i + 256, ... in order, then bi_block_reduce.
__global__ void bi_rms_norm_kernel(const float* x, const float* weight, float* out, int64_t n, float eps) {
  __shared__ float scratch[kRowThreads / kWarp];
  const float* row = x + static_cast<int64_t>(blockIdx.x) * n;
  float squares = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += kRowThreads) squares = fmaf(row[i], row[i], squares);
  const float mean_square = bi_block_reduce(squares, scratch, BiPlus{}) / static_cast<float>(n);
  const float scale = 1.0f / sqrtf(mean_square + eps);
  float* o = out + static_cast<int64_t>(blockIdx.x) * n;
  for (int64_t i = threadIdx.x; i < n; i += kRowThreads) o[i] = weight[i] * (row[i] * scale);
}

__global__ void bi_swiglu_kernel(float* gate, const float* up, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    gate[i] = (g / (1.0f + expf(-g))) * up[i];
  }
}

// ---- per-head norm, rotary and the cache write ---------------------------------------------------------
template <typename F>
__device__ __forceinline__ F* bi_key_row(F* pool, const TokenPlaces& p, int64_t row, int64_t kv_heads,
                                         int64_t kv_head, int64_t dim, int64_t j) {
  const int64_t block = p.tables[row * p.width + j / p.block_size];
  return pool + ((block * kv_heads + kv_head) * p.block_size + j % p.block_size) * dim;
}

// One warp normalises (weight not null) and rotates one head vector x [dim] in place: lane l holds elements
// l, l + 32, ...; the squares' sum is the lane's sequential sum, then the butterfly.
__device__ void bi_norm_rotate(float* x, const float* weight, const float* cos, const float* sin, int64_t dim,
                               float eps) {
  const int lane = threadIdx.x % kWarp;
  if (weight != nullptr) {
    float squares = 0.0f;
    for (int64_t i = lane; i < dim; i += kWarp) squares = fmaf(x[i], x[i], squares);
    const float scale = 1.0f / sqrtf(bi_warp_sum(squares) / static_cast<float>(dim) + eps);
    for (int64_t i = lane; i < dim; i += kWarp) x[i] = weight[i] * (x[i] * scale);
    __syncwarp();
  }
  const int64_t half = dim / 2;
  float lo[kMaxDimPerLane / 2], hi[kMaxDimPerLane / 2];
  int c = 0;
  for (int64_t i = lane; i < half; i += kWarp, ++c) {
    const float a = x[i], b = x[i + half];
    lo[c] = a * cos[i] + (-b) * sin[i];
    hi[c] = b * cos[i + half] + a * sin[i + half];
  }
  __syncwarp();
  c = 0;
  for (int64_t i = lane; i < half; i += kWarp, ++c) {
    x[i] = lo[c];
    x[i + half] = hi[c];
  }
  __syncwarp();
}

// A warp per (token, head) over heads + kv_heads heads: query heads first, then KV heads, which also write
// the token's key and value into the pools.
__global__ void bi_heads_into_cache_kernel(HeadsIntoCache a) {
  const int64_t per_token = a.heads + a.kv_heads;
  const int64_t unit = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  if (unit >= a.places.tokens * per_token) return;
  const int64_t t = unit / per_token, head = unit % per_token;
  const float* cos = a.cos + t * a.dim;
  const float* sin = a.sin + t * a.dim;
  if (head < a.heads) {
    bi_norm_rotate(a.q + (t * a.heads + head) * a.dim, a.q_norm, cos, sin, a.dim, a.eps);
    return;
  }
  const int64_t g = head - a.heads, lane = threadIdx.x % kWarp;
  float* key = a.k + (t * a.kv_heads + g) * a.dim;
  bi_norm_rotate(key, a.k_norm, cos, sin, a.dim, a.eps);
  const int64_t row = a.places.rows[t], slot = a.places.slots[t];
  float* key_dst = bi_key_row(a.key_pool, a.places, row, a.kv_heads, g, a.dim, slot);
  float* value_dst = bi_key_row(a.value_pool, a.places, row, a.kv_heads, g, a.dim, slot);
  const float* value = a.v + (t * a.kv_heads + g) * a.dim;
  for (int64_t i = lane; i < a.dim; i += kWarp) {
    key_dst[i] = key[i];
    value_dst[i] = value[i];
  }
}

// ---- attention -----------------------------------------------------------------------------------------
// A warp per (token, query head), over the visible keys in key order, three passes (each recomputing the
// dot products, which give the same bits every time): the largest score, the sum of exp(score - max), then
// out += (exp(score - max) / sum) * v. Lane l keeps output elements l, l + 32, ...
__device__ __forceinline__ float bi_score(const float* q, const float* key, int64_t dim, float scale) {
  const int lane = threadIdx.x % kWarp;
  float dot = 0.0f;
  for (int64_t i = lane; i < dim; i += kWarp) dot = fmaf(q[i], key[i], dot);
  return bi_warp_sum(dot) * scale;
}

__global__ void bi_attention_kernel(Attention a) {
  const int64_t unit = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  if (unit >= a.places.tokens * a.heads) return;
  const int64_t t = unit / a.heads, head = unit % a.heads, g = head / (a.heads / a.kv_heads);
  const int lane = threadIdx.x % kWarp;
  const int64_t row = a.places.rows[t], last = a.places.slots[t];
  const int64_t first = a.sliding_window > 0 && last - a.sliding_window + 1 > 0 ? last - a.sliding_window + 1 : 0;
  const int64_t* mask = a.key_mask != nullptr ? a.key_mask + row * a.key_mask_stride : nullptr;
  const float* q = a.q + (t * a.heads + head) * a.dim;
  float top = -INFINITY;
  bool any = false;
  for (int64_t j = first; j <= last; ++j) {
    if (mask != nullptr && mask[j] == 0) continue;
    top = fmaxf(top, bi_score(q, bi_key_row(a.key_pool, a.places, row, a.kv_heads, g, a.dim, j), a.dim, a.scale));
    any = true;
  }
  float acc[kMaxDimPerLane] = {};
  if (any) {
    float total = 0.0f;
    for (int64_t j = first; j <= last; ++j) {
      if (mask != nullptr && mask[j] == 0) continue;
      total += expf(bi_score(q, bi_key_row(a.key_pool, a.places, row, a.kv_heads, g, a.dim, j), a.dim, a.scale) - top);
    }
    for (int64_t j = first; j <= last; ++j) {
      if (mask != nullptr && mask[j] == 0) continue;
      const float* key = bi_key_row(a.key_pool, a.places, row, a.kv_heads, g, a.dim, j);
      const float p = expf(bi_score(q, key, a.dim, a.scale) - top) / total;
      const float* value = bi_key_row(a.value_pool, a.places, row, a.kv_heads, g, a.dim, j);
      int c = 0;
      for (int64_t i = lane; i < a.dim; i += kWarp, ++c) acc[c] += p * value[i];
    }
  }
  float* o = a.out + (t * a.heads + head) * a.dim;
  int c = 0;
  for (int64_t i = lane; i < a.dim; i += kWarp, ++c) o[i] = acc[c];
}

// ---- log-probs -------------------------------------------------------------------------------------------
// A block per row: the largest scaled logit (a maximum: any order gives it), then the sum of exp and of
// exp * shifted in double, each thread's elements in order, then bi_block_reduce.
__global__ void bi_token_log_probs_kernel(const float* logits, const int64_t* targets, float* log_probs,
                                          float* entropy, int64_t vocab, float temperature) {
  __shared__ float max_scratch[kRowThreads / kWarp];
  __shared__ double sum_scratch[kRowThreads / kWarp];
  const int64_t r = blockIdx.x;
  const float* row = logits + r * vocab;
  float top = -INFINITY;
  for (int64_t i = threadIdx.x; i < vocab; i += kRowThreads) top = fmaxf(top, row[i] / temperature);
  top = bi_block_reduce(top, max_scratch, BiMax{});
  double sum = 0.0, weighted = 0.0;
  for (int64_t i = threadIdx.x; i < vocab; i += kRowThreads) {
    const float shifted = row[i] / temperature - top;
    const double e = exp(static_cast<double>(shifted));
    sum += e;
    weighted += e * shifted;
  }
  sum = bi_block_reduce(sum, sum_scratch, BiPlus{});
  if (entropy != nullptr) weighted = bi_block_reduce(weighted, sum_scratch, BiPlus{});
  if (threadIdx.x != 0) return;
  const double log_sum = log(sum);
  log_probs[r] = static_cast<float>(static_cast<double>(row[targets[r]] / temperature - top) - log_sum);
  if (entropy != nullptr) entropy[r] = static_cast<float>(log_sum - weighted / sum);
}

cudaStream_t bi_stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

const char* linear(const float* x, const float* w, const float* bias, float* y, int64_t rows, int64_t in,
                   int64_t out, void* stream) {
  if (rows == 0 || out == 0) return nullptr;
  const dim3 grid(static_cast<unsigned>((out + kTile - 1) / kTile), static_cast<unsigned>((rows + kTile - 1) / kTile));
  bi_linear_kernel<<<grid, dim3(kSide, kSide), 0, bi_stream(stream)>>>(x, w, bias, y, rows, in, out);
  return bi_launched();
}

const char* rms_norm(const float* x, const float* weight, float* out, int64_t rows, int64_t n, float eps,
                     void* stream) {
  if (rows == 0) return nullptr;
  bi_rms_norm_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, bi_stream(stream)>>>(x, weight, out, n, eps);
  return bi_launched();
}

const char* swiglu(float* gate, const float* up, int64_t count, void* stream) {
  if (count == 0) return nullptr;
  bi_swiglu_kernel<<<static_cast<unsigned>(bi_blocks(count, kRowThreads)), kRowThreads, 0, bi_stream(stream)>>>(
      gate, up, count);
  return bi_launched();
}

const char* heads_into_cache(const HeadsIntoCache& args, void* stream) {
  const int64_t threads = args.places.tokens * (args.heads + args.kv_heads) * kWarp;
  if (threads == 0) return nullptr;
  bi_heads_into_cache_kernel<<<static_cast<unsigned>((threads + kRowThreads - 1) / kRowThreads), kRowThreads, 0,
                               bi_stream(stream)>>>(args);
  return bi_launched();
}

const char* attention(const Attention& args, void* stream) {
  const int64_t threads = args.places.tokens * args.heads * kWarp;
  if (threads == 0) return nullptr;
  bi_attention_kernel<<<static_cast<unsigned>((threads + kRowThreads - 1) / kRowThreads), kRowThreads, 0,
                        bi_stream(stream)>>>(args);
  return bi_launched();
}

const char* token_log_probs(const float* logits, const int64_t* targets, float* log_probs, float* entropy,
                            int64_t rows, int64_t vocab, float temperature, void* stream) {
  if (rows == 0) return nullptr;
  bi_token_log_probs_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, bi_stream(stream)>>>(
      logits, targets, log_probs, entropy, vocab, temperature);
  return bi_launched();
}

}  // namespace hybridflow::kernels::cuda::invariant
