// Continuous batching of conversation turns (multi-turn agentic rollouts) on a paged KV cache, resuming each
// conversation from its cached prefix.
//
// A conversation asks for one turn at a time: its whole context so far and how many tokens the turn may
// have. Its first turn prefills the context into blocks of its own; when a turn ends (an eos or its token
// limit) the conversation keeps its blocks, and its next turn's context, which extends the ids the cache
// holds (the turn's tokens, then a tool's result or a user's message and the next assistant header), is
// resumed by a delta prefill: only the ids past the cached prefix run through the model, at their
// positions, attending to the cached keys and values. Meanwhile the other conversations keep decoding: a
// step decodes one token for every running turn, whatever turn of its conversation it is, and a turn's
// result is handed back the step it ends, so a conversation waiting for a tool holds back no one.
//
// The turns a step starts are prefilled together, as few forwards as cfg.max_num_batched_tokens allows (a
// forward holds rows x (longest cached prefix + longest new part) positions; a longer context runs alone):
// each row's cached positions are gathered from its blocks, left-padded to the longest and masked, and its new
// ids follow at their own positions, right-padded; their first tokens are drawn in one pass. On a GPU a
// forward of a few dozen ids costs its kernel launches more than its arithmetic, and an agentic step starts
// many turns (every conversation whose tool answered). Token t of conversation c's turn k is drawn with
// sampling_uniform(cfg.seed, k * conversations + c, t): the draws depend neither on the timing of the turns
// nor on which were prefilled together. Under the batch-invariant kernels (model/batch_invariant.h) a turn's
// tokens and log-probs are bit for bit those of prefilling its whole context again, alone; with the default
// kernels they agree to float rounding (a cached key was computed by a decode step or in a batch of
// another size).
//
// Blocks: a conversation is admitted once, reserving the blocks its first context plus cfg.max_new_tokens
// (the response budget of the whole conversation) can hold, and holds them until release(). The pool is
// cfg's (kv_cache_blocks, or what memory_budget_bytes buys: a conversation then waits for blocks), else it
// grows as conversations arrive.
//
// Groups (GRPO's n episodes of one prompt): with group_size g, conversations [k*g, (k+1)*g) are group k. The
// first of them to start admits the whole group on its first context (BlockManager::admit with the group's
// live members, the single-turn generator's sharing): the prompt is prefilled once, its full blocks are held
// once with a reference per member, and its partly filled last block is copied by a member when it first
// writes there (copy on write). A member whose first context is that prompt starts from the prefill's last
// hidden state (bit for bit the one its own prefill would compute) without a prefill; one whose first context
// differs gives its share back and is admitted alone. A group that cannot fit a fixed pool even when it is
// empty falls back to admitting its members one by one.
//
// Prefix caching (cfg.enable_prefix_caching, engine/prefix_cache.h): a first context that begins with whole
// blocks of ids another conversation's first context holds (the system prompt, the tools' schema) starts on
// those blocks while any conversation holds them or the pool still retains them after their conversations
// ended (until it needs them), a reference each, and prefills only the rest. A
// context that would find more such blocks in a prefill still waiting in the step's batch runs that batch
// first, so the first of many conversations sharing a system prompt prefills it for the others.
//
// Read-back in chunks (cfg.readback_interval): a step decodes up to that many tokens for every running turn
// with sampling and eos checks on the device, and reads the device back once at its end (TokenRing), the
// first tokens of the turns it admitted included. Turn ends, the turns handed back and admissions all fall
// at chunk boundaries: a turn that draws an eos id keeps decoding to the chunk's end (its later tokens are
// discarded and the positions they wrote given back to its blocks), and a chunk ends where a turn reaches
// its max_new_tokens. The draws are those of interval 1 (the same uniforms per turn and token); the tokens
// are the same, and the log-probs too under the batch-invariant kernels (with the default ones a step's
// rows round with its row count, which the chunks change). At interval 1 every turn's first token is read
// back at its admission, as rows that end there never join a decode step.
//
// Tensor parallelism: every rank of the model's group holds its own batcher and must make the same calls in
// the same order (engine/turn_schedule.h carries rank 0's to the others); the tokens drawn are rank 0's,
// broadcast over the group each time tokens are drawn, so the ranks' caches and schedules never drift apart.
//
// Pipeline stages: every stage holds its own batcher over its own layers' cache and makes the same calls in
// the same order (engine/turn_schedule.h carries stage 0's to the others). A prefill or decode step hands
// its activations from stage to stage, and the last stage draws the tokens, which reach every stage, so the
// stages' schedules and turn ends agree. Not combined with tensor parallelism.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "hybridflow/engine/block_manager.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/engine/prefix_cache.h"

namespace hybridflow {

// One turn that ended: its tokens (an eos included) and each one's log-prob.
struct BatchedTurn {
  int64_t conversation = 0;
  std::vector<int64_t> ids;
  std::vector<float> log_probs;
};

struct TurnBatcherStats {
  int64_t turns = 0;            // turns generated
  int64_t prefill_tokens = 0;   // positions computed by prefills: first contexts and deltas
  int64_t reused_tokens = 0;    // cached positions not computed again: resumed turns' and prefix-cache hits'
  int64_t full_prefills = 0;    // contexts that did not extend their cache and were prefilled whole
  int64_t decode_steps = 0;
  int64_t host_syncs = 0;       // reads of the device's tokens (a chunk's, or its admissions' at interval 1)
  int64_t largest_step = 0;     // the most turns decoded in one step
  int64_t pool_blocks = 0;      // the pool's size at the end
  int64_t peak_blocks = 0;      // the most blocks held at once
  int64_t shared_prompt_tokens = 0;  // first-context positions group members took from a shared prefill
  int64_t shared_prompt_blocks = 0;  // full prompt blocks group members shared instead of holding their own
  int64_t prefix_cached_tokens = 0;  // first-context positions found in other conversations' blocks
  int64_t prefill_forwards = 0;      // forwards that prefilled contexts (several turns' each where they fit)
};

class TurnBatcher {
 public:
  // Conversations [0, conversations). cfg: sampling, eos ids, the paged cache's block size and pool, and
  // max_new_tokens, the most positions a conversation adds after its first context. cfg.n, continuous_batching
  // and paged_kv_cache are not read. group_size (>= 1): consecutive conversations that share their first
  // context's blocks (see above; 1: none). stages: the communicator over the model's pipeline stages (one rank
  // per stage, in stage order) when the model is a stage, else nullptr. Puts the model in eval mode until
  // destroyed; call from one thread.
  TurnBatcher(CausalLM& model, const GenerationConfig& cfg, int64_t conversations, int64_t group_size = 1,
              Communicator* stages = nullptr);
  ~TurnBatcher();
  TurnBatcher(const TurnBatcher&) = delete;
  TurnBatcher& operator=(const TurnBatcher&) = delete;

  // Queues conversation c's next turn: `context` continued by at most max_new_tokens (>= 1) tokens. An error
  // when c already has a turn queued or running, has a token outside the vocabulary, or would pass its budget.
  void submit(int64_t conversation, std::vector<int64_t> context, int64_t max_new_tokens);
  // One step: prefills the queued turns that fit (first contexts and deltas), then decodes a chunk of up to
  // cfg.readback_interval tokens for every running turn. Returns the turns that ended in it.
  std::vector<BatchedTurn> step();
  // The conversation is over: its blocks are freed (a queued turn of it is dropped).
  void release(int64_t conversation);
  // No turn queued or running.
  bool idle() const;
  // Turns decoding now (a queued turn waiting for blocks is not one).
  int64_t running_turns() const;
  // Blocks held by conversations now.
  int64_t held_blocks() const;
  TurnBatcherStats stats() const;

 private:
  struct Conversation;
  struct Running;
  struct Group;
  struct PendingPrefill;
  // Where a started turn's first token is drawn from: the last hidden state [1, hidden] of its context, known
  // (a group's prompt prefilled in an earlier step) or that of this step's prefill number `prefill`.
  struct FirstHidden {
    torch::Tensor hidden;
    int64_t prefill = -1;
  };
  std::optional<FirstHidden> start(int64_t conversation);
  std::optional<FirstHidden> admit_group(int64_t conversation);
  FirstHidden start_shared(int64_t conversation);
  void leave_group_share(int64_t conversation);
  bool room_for(int64_t positions, int64_t members, int64_t max_positions, const std::vector<int64_t>& prefix = {});
  std::vector<int64_t> cached_prefix(const std::vector<int64_t>& context);
  void begin_turn(int64_t conversation);
  int64_t queue_prefill(int64_t conversation, int64_t from, bool admitted = false);
  void run_prefills();
  torch::Tensor first_hidden(const FirstHidden& first) const;
  struct FirstDraws;
  void run_chunk(int64_t max_steps, FirstDraws& firsts, std::vector<BatchedTurn>& ended);
  void grow_pool(int64_t blocks);

  CausalLM& model_;
  Communicator* stages_ = nullptr;
  GenerationConfig cfg_;
  bool was_training_ = false;
  int64_t fixed_pool_ = 0;  // blocks cfg fixes; 0 = grow on demand
  BlockManager blocks_;
  std::optional<PrefixCache> prefix_cache_;  // cfg.enable_prefix_caching
  PagedKVCache paged_;
  std::vector<std::unique_ptr<Conversation>> conversations_;
  int64_t group_size_ = 1;
  std::vector<Group> groups_;
  std::deque<int64_t> queued_;
  std::vector<Running> running_;
  std::vector<PendingPrefill> pending_;  // this step's prefills not yet run, in the order they came
  std::vector<torch::Tensor> prefilled_;  // this step's prefills' last hidden states [1, hidden], by number
  TurnBatcherStats stats_;
};

}  // namespace hybridflow
