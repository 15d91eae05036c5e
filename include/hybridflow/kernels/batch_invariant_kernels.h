// The batch-invariant kernels on CUDA (rollout.batch_invariant; the contract and the CPU half:
// hybridflow/model/batch_invariant.h). Every output element is reduced in one order fixed by the length it
// reduces over, never by the number of rows, a row's place among them or the launch's grid, so a token gets
// the same bits in a decode step and at its position of a whole-sequence forward, alone or among 63 others:
//   linear           each y[r, o] one thread's fmaf chain over k = 0 .. in - 1 (64 x 64 tiles share loads)
//   rms_norm         a 256-thread block per row: strided sequential sums, a fixed butterfly, warps in order
//   heads_into_cache a warp per head: the per-head norm (Qwen3), rotary, the key and value into the cache
//   attention        a warp per (token, query head), keys in key order: max, sum of exp, weighted values
//   token_log_probs  a 256-thread block per row, sums in double, as the CPU half
// No split-K, atomics or library GEMM. The cost: fp32 on CUDA cores (no tensor cores), roughly an order of
// magnitude below cuBLAS's bf16 matrix products on large prefills; attention recomputes each score three
// times instead of storing it. A decode step, bound by reading the weights, loses less.
//
// float32 CUDA tensors only: a CPU tensor, another dtype or a build without CUDA kernels (HF_CUDA=1) throws
// naming actor_rollout_ref.rollout.batch_invariant. Results are close to the CPU half's (other reduction
// trees and exp), not equal to them.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <utility>

namespace hybridflow::kernels::batch_invariant {

// Whether this build has the CUDA kernels.
bool built();

// x [rows, in] times w [out, in] transposed (+ bias [out]): [rows, out].
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias = {});

// weight [n] * x / rms(x) per row of x [rows, n].
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// gate = silu(gate) * up in place (both [count], contiguous).
void swiglu_(torch::Tensor& gate, const torch::Tensor& up);

// Where each token of a call keeps its keys (int64 on the tokens' device): token t belongs to table row rows[t]
// and writes key index slots[t]; index p of table row r lies in pool block tables[r][p / block_size], at
// offset p % block_size.
struct Places {
  torch::Tensor rows, slots, tables;  // [tokens], [tokens], [table rows, width]
  int64_t block_size = 0;
};

// q [tokens, heads * dim] and k [tokens, kv_heads * dim] in place: each head normed by q_norm / k_norm [dim]
// (undefined: none) and rotated by cos, sin [tokens, dim]; then k and v [tokens, kv_heads * dim] written into
// the pools [blocks, kv_heads, block_size, dim] at each token's place.
struct HeadsIntoCache {
  torch::Tensor q, k, v, q_norm, k_norm, cos, sin, key_pool, value_pool;
  int64_t heads = 0, kv_heads = 0;
  double eps = 1e-6;
};
void heads_into_cache(const HeadsIntoCache& args, const Places& places);

// softmax(q k * scale) v for q [tokens, heads * dim] over each token's visible keys in the pools: indices
// [slot - sliding_window + 1, slot] (all up to slot when 0) that key_mask [table rows, S] (int64, undefined:
// all) does not zero. [tokens, heads * dim], zeros for a token that sees no key.
torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& key_pool, const torch::Tensor& value_pool,
                        const Places& places, const torch::Tensor& key_mask, int64_t heads, int64_t sliding_window,
                        double scale);

// Per row of logits [rows, vocab]: log softmax(z / temperature)[targets[r]] and, with_entropy, the entropy;
// both [rows] float32 on the logits' device (the entropy undefined without with_entropy).
std::pair<torch::Tensor, torch::Tensor> token_log_probs(const torch::Tensor& logits, const torch::Tensor& targets,
                                                        double temperature, bool with_entropy);

}  // namespace hybridflow::kernels::batch_invariant
