// Fused kernels of a decode step on CUDA: RMSNorm (alone and after a residual add), SwiGLU, rotary embedding,
// and attention of one query token per row over a paged KV cache, read in place through the block tables
// (flash-decoding: the KV length split into partitions, reduced by a second kernel).
//
// Every function runs its CUDA kernel on CUDA tensors (a CUDA build) and its CPU reference on CPU tensors: the
// reference computes the same arithmetic in plain loops (fp32 accumulation, the same rounding to the storage
// dtype wherever the unfused operators store an intermediate tensor, the same partitions of the KV length),
// so CI tests the kernels' arithmetic against the unfused operators without a GPU. Inputs are fp32, fp16 or
// bf16 and every operand of one call has the same dtype; the outputs have it too.
#pragma once

#include <torch/torch.h>

namespace hybridflow::kernels {

// Where the model's no-grad decode step uses these kernels instead of its unfused operators (and its other
// passes the rotary kernel, model/rotary_rows.h):
//   kOff:        nowhere (the unfused path: gathered K/V and scaled_dot_product_attention)
//   kCuda:       on CUDA tensors (the default; HF_DECODE_KERNELS=off in the environment selects kOff)
//   kEverywhere: on CUDA and on the CPU through the references (tests of the model's kernel path in CI)
enum class Mode { kOff, kCuda, kEverywhere };
Mode mode();
void set_mode(Mode mode);
// Whether the mode sends a decode step on `device` through these kernels (a CPU build has no CUDA kernels).
bool active_for(const torch::Device& device);
// Whether the kernels cover a step of this shape: a supported dtype, an even head_dim of at most 256 and
// query heads a whole multiple of the KV heads.
bool supports(torch::ScalarType dtype, int64_t heads, int64_t kv_heads, int64_t head_dim);

// weight * rms_norm(x) over the last dimension: (x * rsqrt(mean(x^2) + eps)) rounded to the dtype, times weight.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// The residual stream's add and the next norm in one pass: sum = residual + delta (rounded to the dtype) and
// normed = rms_norm(sum, weight, eps).
struct NormedSum {
  torch::Tensor sum, normed;
};
NormedSum add_rms_norm(const torch::Tensor& residual, const torch::Tensor& delta, const torch::Tensor& weight,
                       double eps);

// silu(gate) * up, elementwise (silu rounded to the dtype first, as the unfused pair of operators stores it).
torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up);

// x * cos + rotate_half(x) * sin for x [rows, heads, head_dim] and cos, sin [rows, head_dim] (every head of a
// row at that row's position), each product rounded to the dtype before the sum.
torch::Tensor rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

// Attention of one query per row, q [rows, heads, head_dim], over a paged cache: key_pool and value_pool
// [blocks, kv_heads, block_size, head_dim] (contiguous), row r's position p in block tables[r][p / block_size]
// at offset p % block_size (tables [rows, width], lengths [rows], int64 on q's device). Row r attends to
// positions [0, lengths[r]] (within `span`, and the last `sliding_window` of them when it is > 0), query head h
// to KV head h / (heads / kv_heads). softmax(q k * scale) v accumulated in fp32; returns [rows, heads, head_dim].
// partition_size 0 chooses one (decode_partition_size on the CPU and for kV1, split_partition_size for kV2); the
// result does not depend on it beyond rounding.
torch::Tensor paged_decode_attention(const torch::Tensor& q, const torch::Tensor& key_pool,
                                     const torch::Tensor& value_pool, const torch::Tensor& tables,
                                     const torch::Tensor& lengths, int64_t span, double scale,
                                     int64_t sliding_window = 0, int64_t partition_size = 0);

// Which CUDA kernels compute paged_decode_attention on CUDA tensors (the CPU reference is the same for both):
//   kV1: the first pair (a thread block per partition of 32-256 positions, the scores in shared memory, the
//        values summed by a thread per element over the positions in turn; always a reduce kernel). The default.
//   kV2: the bandwidth-bound pair (16-byte loads by teams of lanes, an online softmax in registers, the KV length
//        split only when rows x KV heads leave multiprocessors idle, no reduce for one partition). Opt-in until
//        a GPU run has checked it: HF_PAGED_ATTENTION=v2 in the environment (v1 or unset: kV1).
enum class PagedAttentionVariant { kV1, kV2 };
PagedAttentionVariant paged_attention_variant();
void set_paged_attention_variant(PagedAttentionVariant variant);

// kV2's partition size when none is given: the whole span (one partition, no reduce) when rows x kv_heads thread
// blocks reach twice the multiprocessors, else the span split into about that many blocks' worth, at least 64
// positions and a whole number of cache blocks (rounded to an even count) each.
int64_t split_partition_size(int64_t rows, int64_t kv_heads, int64_t span, int64_t block_size,
                             int64_t multiprocessors);

// The KV positions one thread block attends to: 256, halved (down to 32) while rows x kv_heads x partitions
// would leave most of a GPU's multiprocessors idle (batch 1 at long contexts), and while the block's shared
// memory (the group's queries, one score per position and query head, one offset per position) passes 48 KiB.
// 0 when even 32 positions do not fit.
int64_t decode_partition_size(int64_t rows, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t span);

}  // namespace hybridflow::kernels
