// Prefix caching across prompts (vLLM's automatic prefix caching; verl's rollout.enable_prefix_caching): which
// held or retained KV blocks hold which token ids, so that a context beginning with the same ids as another
// whose blocks are still there (a system prompt, a tool schema, an instruction shared by a dataset's prompts)
// starts on those blocks and prefills only the rest.
//
// A full block's keys and values depend on every id up to its end (and on the weights, which one generator's
// lifetime does not change), so a block is recorded under the block before it and the ids it holds: a chain
// from position 0, compared id for id (no hash decides a match). A record is true while its block is held or
// retained and has not been taken again since it was written (BlockManager::takes); stale ones are skipped,
// and pruned as records accumulate. A recorded block stays findable after its sequences end: the block
// manager retains it (BlockManager::keep_contents) until the pool needs it, and taking it again makes its
// record stale (HF_PREFIX_RETENTION=off finds blocks only while they are held, to measure the difference).
// Only blocks a prefill wrote whole are recorded: a decode step's keys round differently.
//
// Pure logic beside the block manager: every tensor-parallel rank or pipeline stage making the same calls finds
// the same blocks.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "hybridflow/engine/block_manager.h"

namespace hybridflow {

class PrefixCache {
 public:
  // block_size: the block manager's, >= 1. Reads HF_PREFIX_RETENTION (on when unset).
  explicit PrefixCache(int64_t block_size);

  // The held or retained blocks holding the longest run of whole blocks that begins `ids`, in order, always leaving at
  // least ids' last position to prefill (its hidden state draws the next token). Empty when none.
  std::vector<int64_t> find(const std::vector<int64_t>& ids, const BlockManager& blocks) const;
  // How many blocks find() would return for `ids` once a prefill of `other` is recorded: the whole blocks the two
  // begin with alike, ids' last position always left out. For a caller deciding whether to run that prefill first.
  int64_t blocks_in_common(const std::vector<int64_t>& ids, const std::vector<int64_t>& other) const;
  // Records table's first `full` blocks as holding ids' first full x block_size positions, all written by
  // prefills of those ids. A block already recorded for the same ids after the same blocks is kept, and the
  // chain stops there when it is another block (the first one recorded stays the one later contexts find).
  // Recorded blocks are marked for the block manager to retain once freed.
  void record(const std::vector<int64_t>& ids, const std::vector<int64_t>& table, int64_t full,
              BlockManager& blocks);
  // Records held now, stale ones included until they are pruned.
  int64_t records() const { return static_cast<int64_t>(records_.size()); }

 private:
  struct Key {
    int64_t parent = -1, parent_takes = 0;  // the block before (-1: none) and its take count when recorded
    std::vector<int64_t> ids;               // the block's ids
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  struct Record {
    int64_t block = 0, takes = 0;
  };
  Key key_of(const std::vector<int64_t>& ids, int64_t index, int64_t parent, const BlockManager& blocks) const;
  static bool live(const Record& r, const BlockManager& blocks);
  void prune(const BlockManager& blocks);

  int64_t block_size_;
  bool retain_freed_;  // recorded blocks are kept by the block manager once freed
  std::unordered_map<Key, Record, KeyHash> records_;
};

}  // namespace hybridflow
