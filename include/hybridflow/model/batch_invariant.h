// Batch-invariant kernels (rollout.batch_invariant): while a BatchInvariantGuard is on and gradients are off,
// the model's forward (full sequences, KV-cached prefill and decode steps, slot and paged caches), its head and
// the token log-probs of generation and of engine/head_log_probs.h reduce every row in one fixed order that
// does not depend on the batch's size, its other rows, padding, a row's place in the batch, the number of
// threads, or whether the row is a decode step with a cache or a position of a whole-sequence forward. The
// log-probs a rollout records then equal the ones the actor recomputes for the same weights, bit for bit.
//
// How: each output element of a matrix product is one dot product in a fixed order (one 8-lane accumulator,
// then a fixed horizontal sum; a tile of rows and outputs shares loads without changing that order); attention
// runs per query and head over the visible keys in key order (max, then sum of exponentials, then the
// weighted values, sequentially); RMSNorm, SiLU, rotary tables and log-softmax are per row with fixed
// sequential sums; each element is computed by one thread. The same code runs for a decode step and for a
// prefill, so a key written by one equals the key the other computes.
//
// On CUDA: CUDA tensors take the CUDA kernels of kernels/batch_invariant_kernels.h through the same entry
// points (linear, token_log_probs and the model's decoder), built alike: each output element of a matrix
// product is one thread's fmaf chain over k in order (64 x 64 tiles share loads; no split-K, atomics or
// cuBLAS), attention is one warp per query and head over the visible keys in key order (max, sum of
// exponentials, weighted values), RMSNorm and log-softmax are one 256-thread block per row with fixed
// reduction trees, and the rotary tables are the CPU's, uploaded. The guarantee holds per device: a GPU
// rollout equals the GPU's recomputation bit for bit; the GPU and the CPU agree closely, not to the bit.
//
// Scope: CPU or CUDA, float32, one tensor-parallel rank, dense layers (no mixture of experts), LoRA adapters
// merged or absent. Anything else throws naming rollout.batch_invariant. Passes with gradients (the actor's
// update) use the ordinary kernels: the guarantee covers the recorded log-probs and the recomputed old
// log-probs.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace hybridflow {

// Turns the batch-invariant kernels on for this thread while alive (nests; restores the previous state).
class BatchInvariantGuard {
 public:
  explicit BatchInvariantGuard(bool on = true);
  ~BatchInvariantGuard();
  BatchInvariantGuard(const BatchInvariantGuard&) = delete;
  BatchInvariantGuard& operator=(const BatchInvariantGuard&) = delete;

 private:
  bool previous_;
};

// True when a guard is on in this thread and gradients are off: the model and the log-prob code then take
// the batch-invariant kernels.
bool batch_invariant_active();

namespace batch_invariant {

// x [rows, in] times w [out, in] transposed (+ bias [out]): [rows, out] float32, each element one fixed-order
// dot product. float32, on the CPU or (the CUDA kernel) on CUDA.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias = {});

// Per row of logits [rows, V] (float32, CPU or CUDA): log softmax(z / temperature)[targets[r]] and,
// with_entropy, the entropy of softmax(z / temperature), both [rows] float32 on the logits' device, from
// fixed-order sums.
struct RowLogProbs {
  torch::Tensor log_probs, entropy;
};
RowLogProbs token_log_probs(const torch::Tensor& logits, const torch::Tensor& targets, double temperature,
                            bool with_entropy);

}  // namespace batch_invariant
}  // namespace hybridflow
