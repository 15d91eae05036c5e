// Two fused CUDA paths the model takes where their requirements hold, each replacing a loop the CPU runs:
//  - a mixture-of-experts layer's experts as one grouped GEMM per projection (libtorch's at::_grouped_mm over
//    the tokens sorted by expert) instead of one small matmul per expert: bf16 activations and weights on a
//    GPU of compute capability 9.0 or newer (Hopper's grouped kernel), hidden and expert widths multiples of 8
//    (16-byte aligned rows);
//  - a packed row's attention (padding-free, use_dynamic_bsz) as one variable-length flash attention call
//    (at::_flash_attention_forward with cumulative sequence lengths, differentiable) instead of one causal
//    attention per sequence: bf16 or fp16 on a GPU of compute capability 8.0 or newer, head_dim a multiple of 8
//    and at most 256.
// Elsewhere (the CPU, fp32, other shapes) the loops run, unchanged. A PortableKernelsGuard forces the loops on
// CUDA too, so that tests compare the fused paths with them on the same device.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace hybridflow {

// Forces the portable loops (expert loop, per-sequence attention) for this thread while alive; nests.
class PortableKernelsGuard {
 public:
  explicit PortableKernelsGuard(bool on = true);
  ~PortableKernelsGuard();
  PortableKernelsGuard(const PortableKernelsGuard&) = delete;
  PortableKernelsGuard& operator=(const PortableKernelsGuard&) = delete;

 private:
  bool previous_;
};

// Whether the experts of a layer of width `hidden` -> `expert_width` run as a grouped GEMM for `rows`
// [tokens, hidden] whose expert weights have the dtype `weight_dtype`.
bool grouped_expert_gemm_applies(const torch::Tensor& rows, torch::Dtype weight_dtype, int64_t hidden,
                                 int64_t expert_width);

// Whether a packed row's attention with queries `q` [1, heads, tokens, head_dim] runs as variable-length flash
// attention.
bool varlen_flash_attention_applies(const torch::Tensor& q);

// Causal attention within each sequence of a packed row by variable-length flash attention: q [1, heads, T, d],
// k and v [1, kv_heads, T, d] (heads a multiple of kv_heads), `sequence_starts` the first position of each
// sequence (ascending, the first 0), `longest` the longest sequence. Returns [1, heads, T, d].
torch::Tensor varlen_flash_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const std::vector<int64_t>& sequence_starts, int64_t longest, double scale);

}  // namespace hybridflow
