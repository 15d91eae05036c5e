// A paged KV cache's blocks, tables and reservations; see block_manager.h.
#include "hybridflow/engine/block_manager.h"

#include <algorithm>
#include <cmath>

#include "hybridflow/core/error.h"

namespace hybridflow {

BlockManager::BlockManager(int64_t num_blocks, int64_t block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  HF_CHECK(num_blocks >= 1, "paged KV cache: the pool needs at least one block, got ", num_blocks);
  HF_CHECK(block_size >= 1, "paged KV cache: block_size must be at least 1 token, got ", block_size);
  references_.assign(static_cast<size_t>(num_blocks), 0);
  takes_.assign(static_cast<size_t>(num_blocks), 0);
  retained_at_.assign(static_cast<size_t>(num_blocks), -1);
  keep_.assign(static_cast<size_t>(num_blocks), 0);
  for (int64_t b = 0; b < num_blocks; ++b) free_.insert(free_.end(), b);
}

int64_t BlockManager::blocks_for(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }

int64_t BlockManager::worst_case_blocks(int64_t prompt_tokens, int64_t n, int64_t max_tokens,
                                        const std::vector<int64_t>& cached_prefix) const {
  const auto cached_blocks = static_cast<int64_t>(cached_prefix.size());
  HF_CHECK(prompt_tokens >= 1 && n >= 1 && max_tokens >= prompt_tokens,
           "paged KV cache: a prompt needs prompt_tokens >= 1, n >= 1 and max_tokens >= prompt_tokens, got ",
           prompt_tokens, ", ", n, " and ", max_tokens);
  HF_CHECK(cached_blocks >= 0 && cached_blocks * block_size_ < prompt_tokens, "paged KV cache: ", cached_blocks,
           " cached blocks of ", block_size_, " positions for a prompt of ", prompt_tokens,
           " tokens (at least its last position is prefilled)");
  // A retained block is taken back from the free ones; a held one costs nothing.
  int64_t held = 0;
  for (int64_t block : cached_prefix)
    if (block >= 0 && block < num_blocks_ && references_[static_cast<size_t>(block)] > 0) ++held;
  const int64_t partial = prompt_tokens % block_size_ != 0 && n > 1 ? 1 : 0;
  return blocks_for(prompt_tokens) - held + n * (blocks_for(max_tokens) - blocks_for(prompt_tokens) + partial);
}

bool BlockManager::can_admit(int64_t prompt_tokens, int64_t n, int64_t max_tokens,
                             const std::vector<int64_t>& cached_prefix) const {
  return worst_case_blocks(prompt_tokens, n, max_tokens, cached_prefix) <= free_blocks() - reserved_;
}

std::vector<int64_t> BlockManager::admit(int64_t prompt_tokens, int64_t n, int64_t max_tokens,
                                         const std::vector<int64_t>& cached_prefix) {
  HF_CHECK(can_admit(prompt_tokens, n, max_tokens, cached_prefix), "paged KV cache: a prompt of ", prompt_tokens,
           " tokens with ", n, " samples of up to ", max_tokens, " positions needs ",
           worst_case_blocks(prompt_tokens, n, max_tokens, cached_prefix), " blocks; ", free_blocks() - reserved_, " of ",
           num_blocks_, " are free and unreserved");
  for (int64_t block : cached_prefix)
    HF_CHECK(block >= 0 && block < num_blocks_ && (references_[static_cast<size_t>(block)] > 0 || retained(block)),
             "paged KV cache: cached prefix block ", block,
             " is neither held nor retained (its contents may have been overwritten)");
  // Retained blocks are held again before any block is taken, so that taking cannot evict them.
  for (int64_t block : cached_prefix)
    if (retained(block)) {
      retained_.erase(retained_at_[static_cast<size_t>(block)]);
      retained_at_[static_cast<size_t>(block)] = -1;
      references_[static_cast<size_t>(block)] = 0;  // held below, by the n sequences
    }
  Sequence shared;
  shared.table = cached_prefix;
  for (auto b = static_cast<int64_t>(cached_prefix.size()); b < blocks_for(prompt_tokens); ++b)
    shared.table.push_back(take_block());
  shared.length = prompt_tokens;
  shared.max_tokens = max_tokens;
  shared.may_copy = prompt_tokens % block_size_ != 0 && n > 1;
  shared.reserved = blocks_for(max_tokens) - blocks_for(prompt_tokens) + (shared.may_copy ? 1 : 0);
  for (int64_t block : cached_prefix) references_[static_cast<size_t>(block)] += n;
  for (size_t b = cached_prefix.size(); b < shared.table.size(); ++b) references_[static_cast<size_t>(shared.table[b])] = n;
  std::vector<int64_t> ids;
  for (int64_t j = 0; j < n; ++j) {
    ids.push_back(next_id_);
    sequences_.emplace(next_id_++, shared);
    reserved_ += shared.reserved;
  }
  return ids;
}

BlockManager::Append BlockManager::append(int64_t id) {
  const auto found = sequences_.find(id);
  HF_CHECK(found != sequences_.end(), "paged KV cache: no running sequence ", id);
  Sequence& s = found->second;
  HF_CHECK(s.length < s.max_tokens, "paged KV cache: sequence ", id, " already holds its ", s.max_tokens,
           " positions (its admission's max_tokens)");
  Append where;
  where.offset = s.length % block_size_;
  const size_t index = static_cast<size_t>(s.length / block_size_);
  if (index == s.table.size()) {
    s.table.push_back(take_block());
    --s.reserved;
    --reserved_;
  } else if (references_[static_cast<size_t>(s.table[index])] > 1) {
    where.copy_from = s.table[index];
    drop_reference(s.table[index]);
    s.table[index] = take_block();
    s.may_copy = false;
    --s.reserved;
    --reserved_;
  } else if (s.may_copy) {
    // The last holder of the shared block writes in place: the copy it had set aside is not needed.
    s.may_copy = false;
    --s.reserved;
    --reserved_;
  }
  where.block = s.table[index];
  ++s.length;
  return where;
}

void BlockManager::truncate(int64_t id, int64_t length) {
  const auto found = sequences_.find(id);
  HF_CHECK(found != sequences_.end(), "paged KV cache: no running sequence ", id);
  Sequence& s = found->second;
  HF_CHECK(length >= 0 && length <= s.length, "paged KV cache: cannot truncate sequence ", id, " of ", s.length,
           " positions to ", length);
  const auto keep = static_cast<size_t>(blocks_for(length));
  while (s.table.size() > keep) {
    HF_CHECK(references_[static_cast<size_t>(s.table.back())] == 1, "paged KV cache: sequence ", id,
             " cannot give back block ", s.table.back(), ", which other sequences share");
    drop_reference(s.table.back());
    s.table.pop_back();
    ++s.reserved;
    ++reserved_;
  }
  s.length = length;
}

void BlockManager::add_blocks(int64_t count) {
  HF_CHECK(count >= 0, "paged KV cache: cannot add ", count, " blocks");
  references_.resize(static_cast<size_t>(num_blocks_ + count), 0);
  takes_.resize(static_cast<size_t>(num_blocks_ + count), 0);
  retained_at_.resize(static_cast<size_t>(num_blocks_ + count), -1);
  keep_.resize(static_cast<size_t>(num_blocks_ + count), 0);
  for (int64_t b = num_blocks_; b < num_blocks_ + count; ++b) free_.insert(free_.end(), b);
  num_blocks_ += count;
}

void BlockManager::release(int64_t id) {
  const auto found = sequences_.find(id);
  HF_CHECK(found != sequences_.end(), "paged KV cache: no running sequence ", id);
  // Last block first: when retained blocks are taken again, a prefix loses its end before its beginning.
  const std::vector<int64_t>& table = found->second.table;
  for (auto block = table.rbegin(); block != table.rend(); ++block) drop_reference(*block);
  reserved_ -= found->second.reserved;
  sequences_.erase(found);
}

const BlockManager::Sequence& BlockManager::sequence(int64_t id) const {
  const auto found = sequences_.find(id);
  HF_CHECK(found != sequences_.end(), "paged KV cache: no running sequence ", id);
  return found->second;
}

const std::vector<int64_t>& BlockManager::table(int64_t id) const { return sequence(id).table; }
int64_t BlockManager::length(int64_t id) const { return sequence(id).length; }

int64_t BlockManager::references(int64_t block) const {
  HF_CHECK(block >= 0 && block < num_blocks_, "paged KV cache: no block ", block, " in a pool of ", num_blocks_);
  return references_[static_cast<size_t>(block)];
}

void BlockManager::keep_contents(int64_t block) {
  HF_CHECK(block >= 0 && block < num_blocks_ && references_[static_cast<size_t>(block)] > 0,
           "paged KV cache: only a held block's contents can be kept, not block ", block);
  keep_[static_cast<size_t>(block)] = 1;
}

bool BlockManager::retained(int64_t block) const {
  HF_CHECK(block >= 0 && block < num_blocks_, "paged KV cache: no block ", block, " in a pool of ", num_blocks_);
  return retained_at_[static_cast<size_t>(block)] >= 0;
}

int64_t BlockManager::takes(int64_t block) const {
  HF_CHECK(block >= 0 && block < num_blocks_, "paged KV cache: no block ", block, " in a pool of ", num_blocks_);
  return takes_[static_cast<size_t>(block)];
}

int64_t BlockManager::take_block() {
  // Reservations guarantee a block to every take; running dry means the accounting is wrong.
  HF_CHECK(free_blocks() > 0, "paged KV cache: no free block left of ", num_blocks_);
  int64_t block = 0;
  if (!free_.empty()) {
    block = *free_.begin();
    free_.erase(free_.begin());
  } else {  // only retained blocks are left: the least recently freed one's contents go
    block = retained_.begin()->second;
    retained_.erase(retained_.begin());
    retained_at_[static_cast<size_t>(block)] = -1;
  }
  keep_[static_cast<size_t>(block)] = 0;
  references_[static_cast<size_t>(block)] = 1;
  ++takes_[static_cast<size_t>(block)];
  peak_used_ = std::max(peak_used_, used_blocks());
  return block;
}

void BlockManager::drop_reference(int64_t block) {
  const auto b = static_cast<size_t>(block);
  if (--references_[b] > 0) return;
  if (keep_[b]) {
    retained_at_[b] = next_retained_;
    retained_.emplace(next_retained_++, block);
  } else {
    free_.insert(block);
  }
}

int64_t kv_blocks_in_budget(double memory_bytes, double utilization, double weight_bytes, double block_bytes) {
  HF_CHECK(utilization > 0.0 && utilization <= 1.0,
           "gpu_memory_utilization must be in (0, 1] (the fraction of memory the rollout may use), got ", utilization);
  HF_CHECK(memory_bytes > 0.0 && block_bytes > 0.0, "paged KV cache: the memory budget (", memory_bytes,
           " bytes) and the block size (", block_bytes, " bytes) must be positive");
  const double room = utilization * memory_bytes - weight_bytes;
  const auto blocks = static_cast<int64_t>(std::floor(room / block_bytes));
  HF_CHECK(blocks >= 1, "gpu_memory_utilization ", utilization, " of ", memory_bytes, " bytes leaves ", room,
           " bytes beside the weights' ", weight_bytes, ": not one KV block of ", block_bytes, " bytes");
  return blocks;
}

int64_t sequences_that_fit(int64_t num_blocks, int64_t block_size, int64_t tokens) {
  HF_CHECK(num_blocks >= 0 && block_size >= 1 && tokens >= 1,
           "sequences_that_fit: needs num_blocks >= 0, block_size >= 1 and tokens >= 1, got ", num_blocks, ", ",
           block_size, ", ", tokens);
  return num_blocks / ((tokens + block_size - 1) / block_size);
}

}  // namespace hybridflow
