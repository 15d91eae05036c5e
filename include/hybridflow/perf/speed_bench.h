// Throughput of the engine's own code paths on a given model, for `hybridflow bench`: decode and prefill
// through generate(), a rollout whose answers stop at different lengths, and a full training step
// (forward + backward + AdamW through TrainEngine). Timings only; roofline.h says what they are measured against.
#pragma once

#include <cstdint>
#include <string>

#include "hybridflow/engine/generation.h"
#include "hybridflow/core/kineto_profile.h"
#include "hybridflow/model/transformer.h"

namespace hybridflow {

struct DecodeSpeed {
  double decode_tokens_per_s = 0;   // batch x (response_length - 1) / (time(response_length) - time(1))
  double prefill_tokens_per_s = 0;  // batch x prompt_length / time(1 new token)
  double seconds = 0;               // one whole generate() call of response_length tokens
  int64_t kv_peak_bytes = 0;        // the KV cache that call held at its peak (GenerationOutput::kv_cache)
  double host_syncs_per_step = 0;   // that call's reads of the device per decode step (GenerationOutput)
};

// generate() on `batch` random prompts of `prompt_length` tokens with no stop token, once for
// `response_length` new tokens and once for 1: the difference is the decode steps alone, the latter is
// (almost all) prefill. Best of `reps` each. response_length >= 2. paged_kv_cache: the paged cache with
// blocks of kv_block_size positions, else the slots' slabs. cuda_graphs, readback_interval: GenerationConfig's.
DecodeSpeed measure_decode(CausalLM& model, int64_t batch, int64_t prompt_length, int64_t response_length,
                           int reps = 2, bool paged_kv_cache = true, int64_t kv_block_size = 16,
                           bool cuda_graphs = false, int64_t readback_interval = 1);

struct RolloutSpeed {
  double seconds = 0;            // the whole generate() call (prefill included), best of `reps`
  double tokens = 0;             // generated tokens (stop tokens included)
  double prompt_tokens = 0;      // every sample's prompt tokens (padding excluded)
  double mean_length = 0;        // per sample
  int64_t max_length = 0;
  int64_t rows = 0;              // prompts x samples
  int64_t stop_ids = 0;          // how many token ids end a sequence
  KVCacheReport kv_cache;        // what the KV cache held (engine/generation.h)
  int64_t host_syncs = 0;        // the generator's reads of the device (GenerationOutput::host_syncs)
  int64_t prefills = 0;          // the passes that admitted waiting prompts (GenerationOutput::prefills)
  int64_t decode_steps = 0;
  // With kept_pools: the first call's seconds (its pools made and its graphs captured), and the graphs the
  // timed call held and captured itself (the rest taken from the call before).
  double first_seconds = 0;
  int64_t decode_graphs = 0, graphs_captured = 0, graph_steps = 0;
  bool kept_pools = false;  // the timed call ran on the pools of the call before
  double tokens_per_s() const { return tokens / seconds; }
};

// An RL rollout: `prompts` random prompts of prompt_length/2 .. prompt_length tokens, `samples` each, sampled
// at temperature 1 for at most `max_length` tokens. Every `stop_every`-th token id is a stop token, so with a
// fresh model's near-uniform next-token distribution each step ends a sequence with probability about
// 1/stop_every: most answers stop early, a few run long, as in real rollouts. Deterministic for a seed, and
// the same tokens on either path. `continuous`: continuous batching with max_num_seqs slots (0 = one per
// sequence); false: the static batch, the generator before continuous batching (generation.h).
struct RolloutOptions {
  int64_t prompts = 64, samples = 8, prompt_length = 32, max_length = 64, stop_every = 8;
  bool continuous = true;
  int64_t max_num_seqs = 0;
  int64_t admission_rows = -1;  // GenerationConfig::admission_rows
  bool paged_kv_cache = true;  // continuous batching on the paged cache, else on slots
  int64_t kv_block_size = 16;
  // Every prompt begins with the same shared_prefix ids (a system prompt) before its own; prefix caching
  // (GenerationConfig::enable_prefix_caching) finds them in the first prompt's blocks.
  int64_t shared_prefix = 0;
  bool enable_prefix_caching = true;
  int64_t max_num_batched_tokens = 8192;  // GenerationConfig::max_num_batched_tokens
  // The paged pool: gpu_memory_utilization of memory_budget_bytes less the weights (0: every sequence fits).
  int64_t memory_budget_bytes = 0;
  double gpu_memory_utilization = 0.5;
  bool cuda_graphs = false;  // GenerationConfig::cuda_graphs
  int64_t readback_interval = 1;  // GenerationConfig::readback_interval
  int reps = 1;
  // Time a call that takes the KV pools and CUDA graphs an untimed first call kept (GenerationConfig::
  // decode_graph_cache, the rollout worker's with free_cache_engine false): an RL run's later rollouts.
  bool kept_pools = false;
};
RolloutSpeed measure_rollout(CausalLM& model, const RolloutOptions& options);

// Seconds of one TrainEngine step (forward, backward, clip, AdamW) on [batch, seq] random tokens with a
// next-token loss; the mean of `steps` after one warm-up step.
double measure_train_step(CausalLM& model, int64_t batch, int64_t seq, int64_t steps);

struct TrainStepSpeed {
  double seconds = 0;      // as measure_train_step
  int64_t peak_bytes = 0;  // the CPU allocator's peak over one more step, above what was allocated before it
};
// measure_train_step and the memory peak of a step (core/cpu_memory.h: tracking is installed if it is not).
TrainStepSpeed measure_train_step_and_peak(CausalLM& model, int64_t batch, int64_t seq, int64_t steps);

// The shape of an RL batch whose answers stop at different lengths, as in measure_rollout: `rows` samples of
// prompt_length/2 .. prompt_length prompt tokens (left padded to prompt_length) and responses that stop
// with probability 1/stop_every after each token, at most response_length (right padded to it).
struct RlBatchShape {
  int64_t rows = 32, prompt_length = 32, response_length = 64, stop_every = 8;
};

struct RlPassSpeed {
  double seconds = 0;         // one pass over the batch (best of `reps`, or mean of the timed update steps)
  double tokens = 0;          // real tokens: every row's prompt and response
  double computed_tokens = 0;  // what the micro-batches ran: rows x width, summed
  double mean_response = 0;
  int64_t micro_batches = 0;
  double tokens_per_s() const { return tokens / seconds; }
};

// verl's actor passes on such a batch: with `train` an update (log-probs and entropy of the responses
// through the chunked head, the clipped ratio x advantage minus an entropy bonus, one optimizer step per
// pass, the mean of `reps` after a warm-up), else the old-log-prob pass (no gradients, best of `reps`). Micro-
// batches of micro_rows rows padded to the batch's width, or with max_tokens > 0 by token count and trimmed
// (engine/token_micro_batches.h). The batch is the same for every call with the same shape.
RlPassSpeed measure_rl_pass(CausalLM& model, const RlBatchShape& shape, bool train, int64_t micro_rows,
                            int64_t max_tokens, int reps);

struct HeadLogProbsMemory {
  double chunked_seconds = 0, full_seconds = 0;    // forward + backward of log-probs and entropy
  int64_t chunked_peak = 0, full_peak = 0;         // the CPU allocator's peak above the inputs, bytes
};
// Log-probs and entropy of `tokens` random hidden states through a [vocab, hidden] head, forward and backward:
// head_log_probs (chunks of tokens) against full [tokens, vocab] logits through token_log_probs.
HeadLogProbsMemory measure_head_log_probs(int64_t tokens, int64_t hidden, int64_t vocab, torch::Dtype dtype);

// One TrainEngine step as measure_train_step runs it (after a warm-up step and a timed one) under Kineto,
// the trace to trace_path when not empty.
ProfileStepSummary profile_train_step(CausalLM& model, int64_t batch, int64_t seq, const std::string& trace_path = "");

struct DecodeProfile {
  ProfileStepSummary per_step;   // one decode step: the run of 1 + steps tokens less the run of 1
  double prefill_seconds = 0;    // the profiled shorter run (the prefill, profiler overhead included)
  int64_t graph_steps = 0;       // of the `steps` profiled, those replayed as CUDA graphs
};
// Profiles measure_decode's work (the same prompts and settings) under Kineto: a run of 1 new token and one of
// 1 + `steps`, after an unprofiled and a profiled warm-up; the difference is `steps` decode steps. With
// cuda_graphs (GenerationConfig's, as readback_interval) the runs are of 2 and 2 + `steps` tokens, so that
// both capture their graph and the difference is `steps` replays. trace_path (optional): the longer run's
// Chrome trace.
DecodeProfile profile_decode(CausalLM& model, int64_t batch, int64_t prompt_length, int64_t steps,
                             bool paged_kv_cache = true, int64_t kv_block_size = 16, const std::string& trace_path = "",
                             bool cuda_graphs = false, int64_t readback_interval = 1);

}  // namespace hybridflow
