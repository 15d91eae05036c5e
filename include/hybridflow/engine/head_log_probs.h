// Per-token log-probabilities and entropy of a language-model head applied to hidden states, computed a
// chunk of tokens at a time: no float32 [tokens, vocab] tensor larger than one chunk ever exists, in the
// forward or in the backward, which recomputes each chunk's logits from the saved hidden states instead of
// keeping them (a fused "linear + log-softmax" as verl's use_fused_kernels / Liger's fused linear cross
// entropy). The backward keeps the logits' gradients of a group of up to H tokens (H: the hidden size) in
// the weight's dtype, no larger than the weight itself, so that the weight's gradient is one matmul per
// group: per ~55-token chunk of a 150k vocabulary, writing (and in bf16 converting and adding) its [V, H]
// result cost several times the whole forward.
// With a 150k vocabulary, [8 x 1024 tokens] of float logits are 5 GB, and autograd kept several such
// tensors (logits, log-softmax, softmax x logits) until the backward; here the peak is a few chunks.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "hybridflow/engine/log_probs.h"
#include "hybridflow/parallel/tensor_parallel.h"

namespace hybridflow {

// Float32 logits per chunk: the chunk holds max(1, kHeadChunkBytes / (4 x local vocabulary)) tokens.
constexpr int64_t kHeadChunkBytes = int64_t{32} << 20;
int64_t head_chunk_tokens(int64_t local_vocab);

// hidden [..., H] in the weight's dtype; weight [V / t, H] (this rank's vocabulary rows of the head, as the
// model's column-parallel lm_head holds them); targets [...] int64 in [0, V). Returns log softmax(z)[target]
// and (with_entropy) the entropy of softmax(z), z = float(hidden . weight^T) / temperature, both [...] in
// float32, over the whole vocabulary under tensor parallelism (two all-reduces of [tokens]-sized tensors,
// whatever the number of chunks). Differentiable w.r.t. hidden and weight; values and gradients equal
// token_log_probs on the full logits up to float rounding. chunk_tokens <= 0: head_chunk_tokens(V / t).
TokenLogProbs head_log_probs(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets,
                             double temperature = 1.0, bool with_entropy = true, const TensorParallelGroup& tp = {},
                             int64_t chunk_tokens = 0);

}  // namespace hybridflow
