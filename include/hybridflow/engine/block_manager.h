// The bookkeeping of a paged KV cache (vLLM's block manager in shape; the tensors are
// model/paged_kv_cache.h's): a pool of fixed-size blocks of block_size token positions, and per sequence a
// block table, where position p lives in block table[p / block_size] at offset p % block_size.
//
// - Blocks are taken as tokens arrive (append), not for a sequence's longest possible length up front.
// - A prompt's n samples share its blocks (admit): the prompt is prefilled and stored once. Blocks carry
//   reference counts; a sample about to write into a block it shares (the prompt's partly filled last
//   block) gets a copy of its own first (copy on write), and the last holder writes in place.
// - A sequence that ends frees its blocks at once (release): they serve waiting prompts.
// - A prompt may start on full blocks that other sequences already hold (admit's cached_prefix: prefix
//   caching across prompts that begin alike, engine/prefix_cache.h finds them); they gain a reference per
//   sample and are never written again, so only the prompt's positions past them are prefilled.
// - A freed block whose contents the prefix cache recorded (keep_contents) is retained rather than wiped: it
//   counts as free, but blocks that hold nothing worth keeping are taken first, and retained ones only when
//   none is left, the least recently freed first (vLLM's evictor). Until then a later prompt may start on it
//   (admit revives it). A sequence frees its table from the end, so a prefix's last blocks go before its first.
//
// Running out mid-decode is avoided by reservation, not preemption: a prompt is admitted only when the free
// blocks, less what running sequences may still take, cover the most its samples can ever hold
// (worst_case_blocks). So a running sequence is never evicted and recomputed, and every sequence's keys
// and values come from one prefill and its own decode steps: the tokens and log-probs are those of the
// slot cache. The price is admitting more cautiously than vLLM's optimistic admission with preemption
// when answers end early; the blocks actually held (peak_used_blocks) stay what the tokens need.
//
// Pure logic, no tensors: every decision is a function of the calls made, so each pipeline stage, running
// the same schedule, makes the same one.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <unordered_map>
#include <vector>

namespace hybridflow {

class BlockManager {
 public:
  // Throws when num_blocks < 1 or block_size < 1.
  BlockManager(int64_t num_blocks, int64_t block_size);

  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  // Blocks held by no sequence, retained ones included (they are taken when nothing else is free).
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size() + retained_.size()); }
  // Free blocks kept for their contents (keep_contents), not yet taken again.
  int64_t retained_blocks() const { return static_cast<int64_t>(retained_.size()); }
  int64_t used_blocks() const { return num_blocks_ - free_blocks(); }
  int64_t peak_used_blocks() const { return peak_used_; }
  // Blocks that running sequences may still take (their reservations, less what they took).
  int64_t reserved_blocks() const { return reserved_; }
  // ceil(tokens / block_size).
  int64_t blocks_for(int64_t tokens) const;

  // What admitting a prompt of prompt_tokens positions with n samples, each growing to max_tokens
  // positions, sets aside: the prompt's blocks once, and per sample the blocks past them up to max_tokens
  // and, when the prompt's last block is partly filled, a copy of it (the sample that holds it last writes
  // in place and returns that block's reservation then). max_tokens >= prompt_tokens >= 1, n >= 1.
  // cached_prefix: the blocks that already hold the prompt's first positions (admit's); those held now cost
  // nothing new, retained ones one free block each; cached_prefix.size() x block_size < prompt_tokens.
  int64_t worst_case_blocks(int64_t prompt_tokens, int64_t n, int64_t max_tokens,
                            const std::vector<int64_t>& cached_prefix = {}) const;
  // True when worst_case_blocks(...) fit in the free blocks not reserved by running sequences.
  bool can_admit(int64_t prompt_tokens, int64_t n, int64_t max_tokens,
                 const std::vector<int64_t>& cached_prefix = {}) const;
  // Takes the prompt's blocks (its positions are then filled by the caller's prefill) and returns n new
  // sequence ids sharing them, each of length prompt_tokens. cached_prefix: full blocks, held or retained,
  // that already hold the prompt's first cached_prefix.size() x block_size positions; the sequences' tables
  // start with them (a reference each; retained ones are held again) and the caller prefills only the
  // positions past them. Throws when !can_admit, or when a cached block is free and not retained or the
  // cached positions reach prompt_tokens.
  std::vector<int64_t> admit(int64_t prompt_tokens, int64_t n, int64_t max_tokens,
                             const std::vector<int64_t>& cached_prefix = {});

  // Where the token at position length(sequence) goes; the sequence's length grows by one. When that
  // block was shared, the sequence has a fresh block now and copy_from names the block whose contents the
  // caller copies into it before writing (else -1). Throws when the sequence would pass its max_tokens.
  struct Append {
    int64_t block = 0, offset = 0, copy_from = -1;
  };
  Append append(int64_t sequence);

  // Gives back the sequence's positions from `length` on (0 <= length <= its length), which its next appends
  // write again: the blocks past the ones `length` positions need are freed and return to its reservation.
  // For positions written ahead of knowing they count (decode steps kept on the device, read back in
  // chunks). Throws when a block to free is shared.
  void truncate(int64_t sequence, int64_t length);

  // Adds `count` free blocks at the end of the pool (ids num_blocks() onwards); tables stay valid. For a pool
  // that grows on demand (multi-turn conversations, whose lengths are known only as they arrive).
  void add_blocks(int64_t count);

  // The sequence ends: its blocks lose a reference (those left with none are free or retained), last block
  // first, and its unused reservation returns to the pool.
  void release(int64_t sequence);

  // Marks a held block's contents as worth keeping once it is freed (retained, see above), until it is taken
  // again. For the prefix cache's recorded blocks.
  void keep_contents(int64_t block);
  // True when the block is free and retained: its contents are those its last takers wrote.
  bool retained(int64_t block) const;

  const std::vector<int64_t>& table(int64_t sequence) const;
  int64_t length(int64_t sequence) const;
  int64_t references(int64_t block) const;
  // How many times the block has been taken from the free blocks: what it holds is what its takers wrote
  // since the last take, so a record of its contents stays true while this count is unchanged and the
  // block is held (engine/prefix_cache.h).
  int64_t takes(int64_t block) const;
  int64_t running() const { return static_cast<int64_t>(sequences_.size()); }

 private:
  struct Sequence {
    std::vector<int64_t> table;
    int64_t length = 0, max_tokens = 0;
    int64_t reserved = 0;     // blocks it may still take
    bool may_copy = false;    // one of those is for a copy of a shared partial block
  };
  const Sequence& sequence(int64_t id) const;
  int64_t take_block();
  void drop_reference(int64_t block);

  int64_t num_blocks_, block_size_;
  std::set<int64_t> free_;  // lowest first: deterministic, and a small run stays at the pool's start
  std::map<int64_t, int64_t> retained_;  // free blocks kept for their contents, by when freed: oldest first
  std::vector<int64_t> references_, takes_;
  std::vector<int64_t> retained_at_;  // per block: its key in retained_, or -1
  std::vector<char> keep_;            // per block: retain it when freed (keep_contents since its last take)
  int64_t next_retained_ = 0;
  std::unordered_map<int64_t, Sequence> sequences_;
  int64_t next_id_ = 0, reserved_ = 0, peak_used_ = 0;
};

// The pool a memory budget buys (vLLM's sizing, verl's rollout.gpu_memory_utilization): the fraction
// `utilization` of memory_bytes, less the weights, in blocks of block_bytes each. Throws naming
// gpu_memory_utilization when the fraction is outside (0, 1] or leaves no block.
int64_t kv_blocks_in_budget(double memory_bytes, double utilization, double weight_bytes, double block_bytes);

// How many sequences of `tokens` positions each fit in num_blocks blocks of block_size, none shared.
int64_t sequences_that_fit(int64_t num_blocks, int64_t block_size, int64_t tokens);

}  // namespace hybridflow
