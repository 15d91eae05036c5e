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

// Float32 logits per chunk: the chunk holds max(1, bytes / (4 x local vocabulary)) tokens, bytes by where
// the hidden states are. Every chunk reads the whole [V, H] weight again (forward, and twice in the backward)
// and launches ~15 operators forward and ~18 backward, whatever its length. On a CPU 32 MiB (55 tokens of a
// 152k vocabulary) keeps the buffers near the caches at little cost; on a GPU 55-token chunks make the
// matmuls weight-read-bound and the launches the host's work (a GRPO update of 25k response tokens: ~460
// chunks, ~15k launches), so a GPU's chunk is 16x longer: ~880 tokens, 1.5 GiB of buffers at its peak.
constexpr int64_t kHeadChunkBytes = int64_t{32} << 20;
constexpr int64_t kHeadChunkBytesCuda = int64_t{512} << 20;
int64_t head_chunk_tokens(int64_t local_vocab, torch::DeviceType device = torch::kCPU);

// hidden [..., H] in the weight's dtype; weight [V / t, H] (this rank's vocabulary rows of the head, as the
// model's column-parallel lm_head holds them); targets [...] int64 in [0, V). Returns log softmax(z)[target]
// and (with_entropy) the entropy of softmax(z), z = float(hidden . weight^T) / temperature, both [...] in
// float32, over the whole vocabulary under tensor parallelism (two all-reduces of [tokens]-sized tensors,
// whatever the number of chunks). Differentiable w.r.t. hidden and weight; values and gradients equal
// token_log_probs on the full logits up to float rounding. chunk_tokens <= 0: head_chunk_tokens(V / t,
// hidden's device). with_sum_pi_squared: also head_sum_pi_squared's values (no gradients), from the same
// chunks' logits instead of a second pass over the head (bit for bit the same values).
TokenLogProbs head_log_probs(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets,
                             double temperature = 1.0, bool with_entropy = true, const TensorParallelGroup& tp = {},
                             int64_t chunk_tokens = 0, bool with_sum_pi_squared = false);

// The sum over the vocabulary of softmax(z)^2 per token (z as in head_log_probs; no gradients), [...] in
// float32, over the whole vocabulary under tensor parallelism (two all-reduces of [tokens]-sized tensors).
// The optimal token baseline weighs each token by 1 - 2 p(target) + this (algo/advantage.h). A pass of its own
// over the head, a chunk of tokens at a time; the old log-prob pass takes it from head_log_probs' chunks.
torch::Tensor head_sum_pi_squared(const torch::Tensor& hidden, const torch::Tensor& weight, double temperature = 1.0,
                                  const TensorParallelGroup& tp = {}, int64_t chunk_tokens = 0);

}  // namespace hybridflow
