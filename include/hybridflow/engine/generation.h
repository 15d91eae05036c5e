// Batched autoregressive generation for rollouts: prompts of different lengths, a KV cache, temperature /
// top-k / top-p / greedy sampling, per-sequence eos stopping, n samples per prompt, reproducible from a seed
// without touching the global RNG.
//
// Continuous batching (the default): at most max_num_seqs sequences decode at once, each in its own
// KV-cache slot; when one ends, its slot goes to the samples of a waiting prompt, whose prompt is prefilled
// once for its n samples. Nothing is padded to a batch's longest member: a row attends to its own length.
// The keys and values live in a paged cache by default (paged_kv_cache below), else in one slab row per slot.
// The static path (continuous_batching = false, and recomputation without a cache) runs every sequence in
// one left-padded batch from which finished rows drop out: the generator before continuous batching,
// kept as the benchmark's baseline.
//
// Sampling draws token t of sequence q (row q of the output) with its own uniform number, a function of
// (seed, q, t) only (sampling_uniform), so a sequence's tokens do not depend on which other sequences share
// its batch, on max_num_seqs, or on the path: both paths return the same tokens.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "hybridflow/model/transformer.h"
#include "hybridflow/parallel/collectives.h"

namespace hybridflow {

class DecodeGraphCache;  // engine/decode_graph_cache.h

// A generation stopped between two tokens (GenerationConfig::stop_requested) and continued later
// (GenerationConfig::resume), per sequence (row i*n+j): the tokens drawn so far, their log-probs, the policy
// version that drew each (empty without refresh_weights), and whether the sequence had ended.
struct PartialSequences {
  std::vector<std::vector<int64_t>> tokens;
  std::vector<std::vector<float>> log_probs;
  std::vector<std::vector<int64_t>> versions;
  std::vector<bool> finished;
};

// Streaming (GenerationConfig::next_prompts): a prompt admitted while a generation runs, with the draws its n
// samples take: sample j draws token t with sampling_uniform(seed, first_sequence + j, t), as row
// first_sequence + j of a call with that seed does, so a group streamed in draws what the same prompt draws in
// the batch it would otherwise have been generated in.
struct StreamedPrompt {
  std::vector<int64_t> ids;
  uint64_t seed = 0;
  int64_t first_sequence = 0;
  // A prompt whose samples a stopped generation had begun: their state (n sequences, as in resume), continued
  // as resume continues a call's own prompts; empty for a fresh prompt. A group whose samples had all ended is
  // handed out as soon as it is admitted.
  PartialSequences saved{};
};

// A prompt's n samples, handed out (GenerationConfig::on_group_finished) as soon as the last of them ended.
struct FinishedGroup {
  int64_t prompt = 0;  // the call's own prompts first (0..B-1), then the streamed ones in admission order
  std::vector<std::vector<int64_t>> tokens;    // per sample, up to and including its eos
  std::vector<std::vector<float>> log_probs;   // per sample and token
  std::vector<std::vector<int64_t>> versions;  // with refresh_weights: the version that drew each token; else empty
  // With refresh_weights: the version that began each sample (drew its first token); else empty.
  std::vector<int64_t> begin_versions;
};

struct GenerationConfig {
  int64_t max_new_tokens = 32;
  double temperature = 1.0;
  int64_t top_k = 0;      // 0 = no top-k filter
  double top_p = 1.0;     // 1 = no nucleus filter
  bool greedy = false;
  int64_t n = 1;          // samples per prompt
  uint64_t seed = 0;
  // A sequence ends at any of these (Llama 3 instruct stops on several); empty = never stop early.
  std::vector<int64_t> eos_token_ids;
  int64_t pad_token_id = 0;
  // Ids at or past this are never drawn (0 = the whole vocabulary): a model's embedding may be padded past
  // its tokenizer (Qwen pads 151,669 tokens to 151,936), and those rows decode to nothing.
  int64_t sampleable_vocab_size = 0;
  bool use_kv_cache = true;   // false recomputes the whole sequence each step (benchmark baseline)
  bool continuous_batching = true;  // false: the static batch (see above); ignored without the KV cache
  // Continuous batching's slots: sequences decoding at once (verl's rollout.max_num_seqs). 0 = every
  // sequence of the call; raised to n when smaller (a prompt's samples are admitted together).
  int64_t max_num_seqs = 0;
  // While sequences decode, waiting prompts join them only when at least this many of their samples (or every
  // prompt still waiting) fit the free places: each join is a prefill, a pass that costs the host about as much
  // at one prompt as at several, so joins come in groups rather than one prompt whenever n places free up
  // (actor_rollout_ref.rollout.admission_rows). -1: a quarter of the slots; 0 or 1: a prompt joins as soon as
  // its samples fit. A sample's tokens do not depend on it (see the draws above); where rows join moves the
  // log-probs' last bits.
  int64_t admission_rows = -1;
  // Continuous batching on a paged KV cache (engine/block_manager.h): blocks of kv_block_size positions
  // taken as tokens arrive, a prompt's blocks stored once and shared by its n samples, a sequence's blocks
  // freed when it ends; a prompt waits until its samples' most blocks are free (never preempted). The
  // same tokens and log-probs as the slots. false: each slot a slab row of longest prompt + max_new_tokens.
  bool paged_kv_cache = true;
  int64_t kv_block_size = 16;
  // Prefix caching across prompts (engine/prefix_cache.h; verl's rollout.enable_prefix_caching): a context that
  // begins with the same whole blocks of ids as another whose blocks are still held, or retained after its
  // sequences ended (until the pool needs them), starts on those blocks and prefills only the rest. The multi-turn turn batcher and continuous batching on the paged cache take it
  // (not with refresh_weights or record_routing, nor for a prompt whose samples come with saved tokens); a
  // prompt that would find more blocks in one admitted beside it is admitted in the next pass, after that one
  // is prefilled. The tokens are those of a prefill of the whole context, and the log-probs too under the
  // batch-invariant kernels (with the default ones a cached key was computed in another prefill, whose
  // length may change the matmuls' rounding).
  bool enable_prefix_caching = true;
  // The most positions one prefill forward holds (verl's rollout.max_num_batched_tokens): continuous batching on
  // the paged cache admits prompts, and the multi-turn batcher prefills a step's turns, together while rows x
  // (longest cached prefix + longest new part) stays within it; a longer one is prefilled alone. It bounds a
  // forward's activations and its gathered keys and values to what one context of this length needs.
  int64_t max_num_batched_tokens = 8192;
  // The pool: kv_cache_blocks blocks when > 0; else, when memory_budget_bytes > 0, gpu_memory_utilization of
  // it less the weights (verl's rollout.gpu_memory_utilization; the budget is one device's memory, the
  // blocks span every layer of the model); else enough for the sequences that run at once (max_num_seqs) at
  // their longest, so that the blocks never hold a prompt back.
  int64_t kv_cache_blocks = 0;
  double gpu_memory_utilization = 0.5;
  int64_t memory_budget_bytes = 0;
  // Decode steps replayed as CUDA graphs (engine/decode_graphs.h; verl's rollout.enforce_eager: false), one
  // per bucket of rows and KV span, on the paged cache. Eager wherever graphs do not apply: a CPU device, the
  // slots, models CausalLM::decodes_on_device() excludes, partial rollouts (refresh_weights), router recording.
  bool cuda_graphs = false;
  // With cuda_graphs on a CUDA device: fail where the graphs cannot replay, naming what stands in the way
  // (engine/decode_graph_obstacles.h), instead of decoding eagerly. The trainer sets it where
  // actor_rollout_ref.rollout.enforce_eager is false by name; its default (unset) leaves it off.
  bool require_cuda_graphs = false;
  // Continuous batching on the paged cache: the pools (and their CUDA graphs) are kept here at the end of the
  // call, and taken by the next call that they hold (engine/decode_graph_cache.h), so that a rollout worker
  // captures its graphs once, not in every rollout. Unset: the call's pools and graphs go with it. A worker sets
  // it where actor_rollout_ref.rollout.free_cache_engine is false (the KV cache stays between rollouts).
  std::shared_ptr<DecodeGraphCache> decode_graph_cache{};
  // Decode steps between two reads of the device (verl has none; actor_rollout_ref.rollout.readback_interval):
  // tokens, log-probs and the finished-row mask stay on the device for this many steps and are read back
  // once; a row that ends within a chunk keeps decoding to its end and its extra tokens are discarded, and
  // rows are admitted and retired only between chunks. The same tokens and log-probs at every interval; a
  // chunk ends early where a row reaches max_new_tokens. Partial-rollout hooks are asked between chunks.
  int64_t readback_interval = 1;
  // Partial rollouts (continuous batching, one pipeline stage): asked before every scheduling round, it
  // returns the policy version the model holds, having swapped newer weights into it in place when some
  // were sent. When the version changes, every running sequence's prefix (prompt and tokens so far) is
  // prefilled again with the new weights into its own cache, and its later tokens are drawn from them; the
  // tokens drawn before stay as they were, with their log-probs. Empty: one version for the whole call.
  std::function<int64_t()> refresh_weights{};
  // Asked before every scheduling round (same paths as refresh_weights): true stops the generation between
  // two tokens, and the output holds what was drawn so far (GenerationOutput::stopped, finished). A
  // checkpoint of partial rollouts stops the rollout this way.
  std::function<bool()> stop_requested{};
  // Continues a stopped generation of the same prompts and config: each sequence starts with its saved
  // tokens, log-probs and versions. A sequence that had ended stays as it was; one with tokens has its
  // prefix (prompt and every token but the last) prefilled into its cache, as after a weight refresh, and
  // draws its token number t with the same uniform as it would have without the stop; one without starts
  // as usual. Null: a fresh generation.
  const PartialSequences* resume = nullptr;
  // Streaming (continuous batching, one pipeline stage, no routing record): asked before every scheduling round
  // in which slots are free for `room` more prompts' samples than wait, or nothing runs and nothing waits
  // (`idle`), it returns prompts to admit after the call's own ones (they may be fewer or more than room; the
  // surplus waits). Idle, an empty answer ends the generation; a source with more to come blocks instead.
  // Streamed prompts are at most max_prompt_length tokens long (it sizes the KV cache; checked).
  std::function<std::vector<StreamedPrompt>(int64_t room, bool idle)> next_prompts{};
  int64_t max_prompt_length = 0;
  // Called once per prompt, in the order the groups end (within one decoding round, in the rows' slot
  // order), as soon as all its n samples ended; the output still holds every row.
  std::function<void(FinishedGroup&&)> on_group_finished{};
  // Router replay (verl's router_replay.mode R3): keep the experts every MoE layer chose for every token the
  // model read, prompt and response (GenerationOutput::routed_experts). Continuous batching, unstaged only.
  bool record_routing = false;
};

// What continuous batching's KV cache held (both paths; zeros on the static path).
struct KVCacheReport {
  int64_t peak_bytes = 0;     // paged: blocks in use at the peak x block_bytes; slots: the slabs
  int64_t block_bytes = 0;    // paged: one block over every layer, keys and values
  int64_t pool_blocks = 0;    // paged: blocks in the pool
  bool kept_pools = false;    // paged: the pool was an earlier call's (GenerationConfig::decode_graph_cache)
  int64_t peak_blocks = 0;    // paged: the most blocks in use at once
  int64_t sequences_fit = 0;  // sequences of the longest prompt + max_new_tokens that fit at once, unshared
  int64_t prefix_cached_tokens = 0;  // paged: prompt positions found in other prompts' blocks, not prefilled
};

struct GenerationOutput {
  torch::Tensor prompts;        // [B*n, P] int64, left-padded with pad_token_id (row i*n+j = sample j of prompt i)
  torch::Tensor prompt_mask;    // [B*n, P] int64 (1 real, 0 pad)
  torch::Tensor responses;      // [B*n, R] int64, R = longest response; after eos (inclusive eos kept) padded with pad
  torch::Tensor response_mask;  // [B*n, R] int64, 1 for generated tokens up to and including eos
  torch::Tensor log_probs;      // [B*n, R] float32, log-prob of each sampled token under softmax(logits / temperature)
                                // (greedy: temperature 1), 0 where masked
  // With refresh_weights: [B*n, R] int64, the policy version that drew each token (padding holds the last
  // version), and how many sequences were prefilled again with newer weights mid-generation.
  torch::Tensor token_versions;
  int64_t resumed_sequences = 0;
  // With stop_requested: whether the generation was stopped before every sequence ended, and [B*n] bool
  // (CPU) which sequences had ended (eos or max_new_tokens) when it returned.
  bool stopped = false;
  torch::Tensor finished;
  // With record_routing: [B*n, P + R, moe_layers, k] int32, the experts of each token of prompts ++ responses
  // in each MoE layer (in the order the router ranked them), -1 where no token was read: padding, and each
  // sequence's last token (sampled, never fed back). Undefined otherwise.
  torch::Tensor routed_experts;
  KVCacheReport kv_cache;
  // With cuda_graphs: the decode graphs held (decode_graphs_taken of them captured by earlier calls and kept,
  // GenerationConfig::decode_graph_cache), and the decode steps replayed through them (the rest eager).
  int64_t decode_graphs = 0;
  int64_t decode_graphs_taken = 0;
  int64_t graph_steps = 0;
  // Host synchronisations: the generator's reads of the device (each prefill's first tokens, each chunk of
  // decode steps), and the decode steps it ran (a step of the static batch or of continuous batching).
  int64_t host_syncs = 0;
  int64_t decode_steps = 0;
  int64_t prefills = 0;  // continuous batching: the passes that admitted waiting prompts
};

// Runs under NoGradGuard in eval mode and restores the model's train/eval mode afterwards. Output tensors
// live on the model's device. Throws hybridflow::Error on an empty prompt or invalid sampling settings.
//
// A pipeline stage generates together with the other stages of its model (`stages`: one rank per stage, in
// stage order; every stage calls with the same prompts and config). Each step's hidden states pass from
// stage to stage, the last stage samples, and its tokens and log-probs are broadcast, so every stage
// returns the whole output. One micro-batch: a stage waits while the others compute.
GenerationOutput generate(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                          const GenerationConfig& cfg, Communicator* stages = nullptr);

// Next-token choice from last-position logits [rows, vocab] (float32): returns the tokens [rows] and their
// log-probs under softmax(logits / temperature) (greedy: temperature 1). top-k / top-p only restrict
// which tokens may be drawn. Row r draws by inverse transform with uniforms[r] in [0, 1): the first token
// whose cumulative probability exceeds it (ignored when greedy).
std::pair<torch::Tensor, torch::Tensor> sample_next_tokens(const torch::Tensor& logits, const GenerationConfig& cfg,
                                                           const std::vector<double>& uniforms);

// The uniform number in [0, 1) with which sequence `sequence` draws its token number `step` under `seed`:
// a counter-based hash (splitmix64), so any sequence's draws are known without generating the others'.
double sampling_uniform(uint64_t seed, int64_t sequence, int64_t step);

}  // namespace hybridflow
