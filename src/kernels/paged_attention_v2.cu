// The paged decode attention written for HBM bandwidth (HF_PAGED_ATTENTION=v2; decode_kernels.h says what it
// computes, decode_kernels.cu holds the first kernel pair). What the first pair lacked, and this one does:
// - 16-byte loads: a team of lanes reads one position's key (or value) row, each lane 16 bytes of it, so the
//   two teams of a warp at head_dim 128 in bf16 read 512 contiguous bytes of a cache block per instruction;
// - every load of a warp's step issued before any is used (keys and values of 4 positions per team), instead
//   of one dependent 2-byte load per position and dim in a serial loop;
// - the group's queries in registers and every query head of a KV head scored and accumulated from the same
//   loaded key and value (GQA);
// - an online softmax per team, merged across teams and warps once at the end, so keys and values are read
//   once (no scores in shared memory, no second pass over the values);
// - the KV length split only when rows x KV heads leave multiprocessors idle (decode_kernels.cpp chooses), the
//   output written directly when a row's KV head is one partition, and a reduce that reads each partition's
//   statistics once (a lane per partition) rather than in dependent loops.
// Sums run in another order than the CPU reference's and products fuse with their sums (fmaf): the results
// equal it up to rounding, as the first pair's do.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "kernels/cuda_convert.cuh"
#include "kernels/cuda_launch.h"

namespace hybridflow::kernels::cuda {
namespace {

// kVec elements read by one load instruction (16 bytes where head_dim and the pointers allow it).
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

template <typename T, int kVec>
__device__ __forceinline__ Pack<T, kVec> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, kVec>*>(p);
}

// Zeros for what a lane does not load (a position outside the range, elements past head_dim): they enter the
// dot products and the weighted sums with weight 0, and stale registers could hold NaN.
template <typename T, int kVec>
__device__ __forceinline__ Pack<T, kVec> zero_pack() {
  Pack<T, kVec> p;
#pragma unroll
  for (int e = 0; e < kVec; ++e) p.v[e] = from_float<T>(0.0f);
  return p;
}

constexpr int kLanes = 32;
constexpr int kSplitWarps = 4;  // warps of one thread block: each takes every fourth step of its partition
constexpr int kHeadDimLimit = 256;
constexpr unsigned kAll = 0xffffffffu;

// Chunks of kVec elements one lane holds of a head_dim-256 row (a team has at most 32 lanes).
template <int kVec>
__host__ __device__ constexpr int chunks_for() {
  return kHeadDimLimit / (kLanes * kVec) > 0 ? kHeadDimLimit / (kLanes * kVec) : 1;
}
// Positions a team loads per step: 4 (8 loads of 16 bytes in flight per lane), fewer where the lane's registers
// also hold more query heads or chunks (at most 128 registers for the common shapes: see the launch bounds).
template <int kVec, int kGroup>
__host__ __device__ constexpr int positions_for() {
  const int by_chunks = chunks_for<kVec>() < 4 ? 4 / chunks_for<kVec>() : 1;
  const int by_group = kGroup <= 2 ? 4 : 8 / kGroup;
  return by_chunks < by_group ? by_chunks : by_group;
}

// Block (partition, KV head x tile of its query heads, row). A team of 2^team_shift lanes covers one position's
// head_dim (lane l of the team: elements [(c * team + l) * kVec, + kVec) for chunk c); a warp's teams take
// consecutive positions, kPositions of them per team and step. Each team keeps, for each query head of the tile,
// the running maximum score, the sum of exp(score - max) and the unnormalised sum of exp(score - max) v.
// At most 128 registers for one or two heads a tile: four blocks on a multiprocessor (16 warps), so that batch 64
// at Qwen3-1.7B's 8 KV heads (512 blocks) fits on 132 multiprocessors in one wave.
template <typename T, int kVec, int kGroup>
__global__ void __launch_bounds__(kSplitWarps* kLanes, kGroup <= 2 ? 4 : 2)
    paged_attention_split_kernel(PagedAttention a, int team_shift) {
  constexpr int kChunks = chunks_for<kVec>();
  constexpr int kPositions = positions_for<kVec, kGroup>();
  __shared__ float warp_max[kSplitWarps][kGroup], warp_sum[kSplitWarps][kGroup];
  __shared__ float warp_acc[kSplitWarps][kGroup][kHeadDimLimit];

  const int lane = threadIdx.x % kLanes, warp = threadIdx.x / kLanes;
  const int team = 1 << team_shift, teams = kLanes >> team_shift;
  const int team_id = lane >> team_shift, in_team = lane & (team - 1);
  const int group = static_cast<int>(a.heads / a.kv_heads), tiles = (group + kGroup - 1) / kGroup;
  const int64_t part = blockIdx.x, row = blockIdx.z;
  const int64_t kv_head = blockIdx.y / tiles;
  const int first = static_cast<int>(blockIdx.y % tiles) * kGroup;  // the tile's first head within the group
  const int dim = static_cast<int>(a.dim), vectors = dim / kVec;
  const int64_t head0 = kv_head * group + first;                   // the tile's first query head

  // The lane's elements of each query head (zeros for heads past the group and elements past head_dim).
  const T* q = static_cast<const T*>(a.q) + (row * a.heads + head0) * a.dim;
  float qr[kGroup][kChunks][kVec];
#pragma unroll
  for (int g = 0; g < kGroup; ++g)
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int v = c * team + in_team;
      const bool here = first + g < group && v < vectors;
      Pack<T, kVec> p = zero_pack<T, kVec>();
      if (here) p = load_pack<T, kVec>(q + g * a.dim + v * kVec);
#pragma unroll
      for (int e = 0; e < kVec; ++e) qr[g][c][e] = here ? to_float(p.v[e]) : 0.0f;
    }

  const int64_t length = a.lengths[row] + 1;
  const int64_t end = length < a.span ? length : a.span;
  const int64_t window_begin = a.sliding_window > 0 ? length - a.sliding_window : 0;
  const int64_t begin = window_begin > 0 ? window_begin : 0;
  const int64_t size = a.partition_size, base = part * size;
  const int64_t lo = begin > base ? begin : base;
  const int64_t hi = end < base + size ? end : base + size;

  float m[kGroup], l[kGroup], acc[kGroup][kChunks][kVec];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    m[g] = -FLT_MAX;
    l[g] = 0.0f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[g][c][e] = 0.0f;
  }

  const T* keys = static_cast<const T*>(a.key_pool);
  const T* values = static_cast<const T*>(a.value_pool);
  const int64_t* table = a.tables + row * a.width;
  const int64_t step = static_cast<int64_t>(teams) * kPositions;  // positions of one warp step
  const float scale = a.scale;
  // Steps at base + k * step (aligned with the partition, so with cache blocks), warp w taking k = w, w + 4, ...
  // from the first step that holds a visible position.
  for (int64_t at = base + ((lo - base) / step + warp) * step; at < hi; at += kSplitWarps * step) {
    // The team's positions at + team_id + i * teams: their cache block and slot stepped along, one division.
    int64_t offset[kPositions];
    bool valid[kPositions];
    const int64_t first_position = at + team_id;
    int64_t entry = first_position / a.block_size, slot = first_position - entry * a.block_size;
#pragma unroll
    for (int i = 0; i < kPositions; ++i) {
      const int64_t p = first_position + static_cast<int64_t>(i) * teams;
      valid[i] = p >= lo && p < hi;
      offset[i] = valid[i] ? ((table[entry] * a.kv_heads + kv_head) * a.block_size + slot) * a.dim : 0;
      for (slot += teams; slot >= a.block_size; slot -= a.block_size) ++entry;
    }
    Pack<T, kVec> kr[kPositions][kChunks], vr[kPositions][kChunks];
#pragma unroll
    for (int i = 0; i < kPositions; ++i)
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int v = c * team + in_team;
        kr[i][c] = zero_pack<T, kVec>();
        vr[i][c] = zero_pack<T, kVec>();
        if (valid[i] && v < vectors) {
          kr[i][c] = load_pack<T, kVec>(keys + offset[i] + v * kVec);
          vr[i][c] = load_pack<T, kVec>(values + offset[i] + v * kVec);
        }
      }
    // Scores: each lane's part of the dot product, summed over the team (every lane of it gets the sum).
    float s[kPositions][kGroup];
#pragma unroll
    for (int i = 0; i < kPositions; ++i)
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
#pragma unroll
          for (int e = 0; e < kVec; ++e) dot = fmaf(qr[g][c][e], to_float(kr[i][c].v[e]), dot);
        for (int o = team >> 1; o > 0; o >>= 1) dot += __shfl_xor_sync(kAll, dot, o);
        s[i][g] = valid[i] ? dot * scale : -FLT_MAX;
      }
    // One rescale of the running sums per step, then the step's weights times its values.
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      float top = m[g];
#pragma unroll
      for (int i = 0; i < kPositions; ++i) top = fmaxf(top, s[i][g]);
      const float keep = expf(m[g] - top);
      l[g] *= keep;
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[g][c][e] *= keep;
#pragma unroll
      for (int i = 0; i < kPositions; ++i) {
        const float w = valid[i] ? expf(s[i][g] - top) : 0.0f;
        l[g] += w;
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
#pragma unroll
          for (int e = 0; e < kVec; ++e) acc[g][c][e] = fmaf(w, to_float(vr[i][c].v[e]), acc[g][c][e]);
      }
      m[g] = top;
    }
  }

  // The teams of a warp merged (lanes holding the same elements are team lanes apart), then the warps.
  for (int o = team; o < kLanes; o <<= 1) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const float m2 = __shfl_xor_sync(kAll, m[g], o), l2 = __shfl_xor_sync(kAll, l[g], o);
      const float top = fmaxf(m[g], m2), mine = expf(m[g] - top), theirs = expf(m2 - top);
      l[g] = l[g] * mine + l2 * theirs;
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const float other = __shfl_xor_sync(kAll, acc[g][c][e], o);
          acc[g][c][e] = acc[g][c][e] * mine + other * theirs;
        }
      m[g] = top;
    }
  }
  if (team_id == 0) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      if (in_team == 0) {
        warp_max[warp][g] = m[g];
        warp_sum[warp][g] = l[g];
      }
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int v = c * team + in_team;
        if (v < vectors)
#pragma unroll
          for (int e = 0; e < kVec; ++e) warp_acc[warp][g][v * kVec + e] = acc[g][c][e];
      }
    }
  }
  __syncthreads();

  // A thread per (query head of the tile, element): the block's result, normalised when this partition is the
  // whole span (no reduce follows), else its statistics for the reduce.
  for (int i = threadIdx.x; i < kGroup * dim; i += blockDim.x) {
    const int g = i / dim, d = i % dim;
    if (first + g >= group) break;  // i grows with g: every later element is past the group too
    float top = -FLT_MAX;
#pragma unroll
    for (int w = 0; w < kSplitWarps; ++w) top = fmaxf(top, warp_max[w][g]);
    float total = 0.0f, sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kSplitWarps; ++w) {
      const float f = expf(warp_max[w][g] - top);
      total += warp_sum[w][g] * f;
      sum += warp_acc[w][g][d] * f;
    }
    const int64_t head = head0 + g;
    if (a.partitions == 1) {
      static_cast<T*>(a.out)[(row * a.heads + head) * a.dim + d] = from_float<T>(total > 0.0f ? sum / total : 0.0f);
    } else {
      const int64_t stats = (row * a.heads + head) * a.partitions + part;
      a.partial_out[stats * a.dim + d] = sum;
      if (d == 0) {
        a.partial_max[stats] = top;
        a.partial_sum[stats] = total;
      }
    }
  }
}

// Block (query head, row): the partitions' weights exp(max_p - max) once, a lane per partition, into shared
// memory; then a thread per two elements sums the weighted partial outputs and normalises.
template <typename T>
__global__ void __launch_bounds__(128) paged_attention_merge_kernel(PagedAttention a) {
  extern __shared__ float weight[];  // [partitions]
  __shared__ float total_s;
  const int64_t head = blockIdx.x, row = blockIdx.y;
  const int64_t stats = (row * a.heads + head) * a.partitions;
  const int partitions = static_cast<int>(a.partitions);
  if (threadIdx.x < kLanes) {
    const int lane = threadIdx.x;
    float top = -FLT_MAX;
    for (int p = lane; p < partitions; p += kLanes)
      if (a.partial_sum[stats + p] > 0.0f) top = fmaxf(top, a.partial_max[stats + p]);
    for (int o = kLanes / 2; o > 0; o >>= 1) top = fmaxf(top, __shfl_xor_sync(kAll, top, o));
    float total = 0.0f;
    for (int p = lane; p < partitions; p += kLanes) {
      const float sum = a.partial_sum[stats + p];
      const float w = sum > 0.0f ? expf(a.partial_max[stats + p] - top) : 0.0f;
      weight[p] = w;
      total += w * sum;
    }
    for (int o = kLanes / 2; o > 0; o >>= 1) total += __shfl_xor_sync(kAll, total, o);
    if (lane == 0) total_s = total;
  }
  __syncthreads();
  const float total = total_s;
  const int pairs = static_cast<int>(a.dim / 2);
  const float2* parts = reinterpret_cast<const float2*>(a.partial_out + stats * a.dim);
  T* out = static_cast<T*>(a.out) + (row * a.heads + head) * a.dim;
  for (int d = threadIdx.x; d < pairs; d += blockDim.x) {
    float x = 0.0f, y = 0.0f;
#pragma unroll 4
    for (int p = 0; p < partitions; ++p) {
      const float w = weight[p];
      const float2 v = parts[static_cast<int64_t>(p) * pairs + d];
      x = fmaf(w, v.x, x);
      y = fmaf(w, v.y, y);
    }
    out[2 * d] = from_float<T>(total > 0.0f ? x / total : 0.0f);
    out[2 * d + 1] = from_float<T>(total > 0.0f ? y / total : 0.0f);
  }
}

const char* launch_error() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

template <typename T, int kVec, int kGroup>
const char* launch_split(const PagedAttention& a, int team_shift, cudaStream_t stream) {
  const int64_t group = a.heads / a.kv_heads, tiles = (group + kGroup - 1) / kGroup;
  const dim3 grid(static_cast<unsigned>(a.partitions), static_cast<unsigned>(a.kv_heads * tiles),
                  static_cast<unsigned>(a.rows));
  paged_attention_split_kernel<T, kVec, kGroup><<<grid, kSplitWarps * kLanes, 0, stream>>>(a, team_shift);
  return launch_error();
}

template <typename T, int kVec>
const char* launch_by_group(const PagedAttention& a, int team_shift, cudaStream_t stream) {
  const int64_t group = a.heads / a.kv_heads;
  if (group <= 1) return launch_split<T, kVec, 1>(a, team_shift, stream);
  if (group <= 2) return launch_split<T, kVec, 2>(a, team_shift, stream);
  if (group <= 4) return launch_split<T, kVec, 4>(a, team_shift, stream);
  return launch_split<T, kVec, 8>(a, team_shift, stream);  // larger groups in tiles of 8 heads
}

bool aligned_to(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <typename T>
const char* split_typed(const PagedAttention& a, cudaStream_t stream) {
  constexpr int kWide = static_cast<int>(16 / sizeof(T));
  const auto all_aligned = [&](uintptr_t bytes) {
    return aligned_to(a.q, bytes) && aligned_to(a.key_pool, bytes) && aligned_to(a.value_pool, bytes);
  };
  // 16-byte loads where every row starts on 16 bytes, else pairs of elements (head_dim is even).
  const bool wide = a.dim % kWide == 0 && all_aligned(16);
  if (!wide && !all_aligned(2 * sizeof(T))) return "paged_decode_attention_v2: operands not aligned to two elements";
  const int vec = wide ? kWide : 2;
  const int64_t vectors = a.dim / vec;
  int team_shift = 0;
  while ((int64_t{1} << team_shift) < vectors && team_shift < 5) ++team_shift;
  const char* e = wide ? launch_by_group<T, kWide>(a, team_shift, stream)
                       : launch_by_group<T, 2>(a, team_shift, stream);
  if (e != nullptr || a.partitions == 1) return e;
  const int threads = static_cast<int>((a.dim / 2 + kLanes - 1) / kLanes * kLanes);
  paged_attention_merge_kernel<T><<<dim3(static_cast<unsigned>(a.heads), static_cast<unsigned>(a.rows)), threads,
                                    static_cast<size_t>(a.partitions) * sizeof(float), stream>>>(a);
  return launch_error();
}

}  // namespace

const char* paged_decode_attention_v2(Dtype dtype, const PagedAttention& args, void* stream) {
  if (args.rows == 0) return nullptr;
  if (args.dim % 2 != 0 || args.dim > kHeadDimLimit)
    return "paged_decode_attention_v2: head_dim must be even and at most 256";
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case Dtype::kFloat32: return split_typed<float>(args, s);
    case Dtype::kFloat16: return split_typed<__half>(args, s);
    case Dtype::kBFloat16: return split_typed<__nv_bfloat16>(args, s);
  }
  return "unknown dtype";
}

}  // namespace hybridflow::kernels::cuda
