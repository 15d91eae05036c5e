// Which held KV blocks hold which prefixes; see engine/prefix_cache.h.
#include "hybridflow/engine/prefix_cache.h"

#include <algorithm>

#include "hybridflow/core/env_switch.h"
#include "hybridflow/core/error.h"

namespace hybridflow {

PrefixCache::PrefixCache(int64_t block_size)
    : block_size_(block_size),
      retain_freed_(env_switch("HF_PREFIX_RETENTION", true, "keeping freed KV blocks' prefixes for later prompts")) {
  HF_CHECK(block_size >= 1, "prefix cache: block_size must be at least 1 token, got ", block_size);
}

size_t PrefixCache::KeyHash::operator()(const Key& k) const {
  // FNV-1a over the fields: equal keys hash equally, and a match is then compared id for id.
  uint64_t h = 14695981039346656037ull;
  const auto mix = [&](int64_t v) {
    h ^= static_cast<uint64_t>(v);
    h *= 1099511628211ull;
  };
  mix(k.parent);
  mix(k.parent_takes);
  for (int64_t id : k.ids) mix(id);
  return static_cast<size_t>(h);
}

PrefixCache::Key PrefixCache::key_of(const std::vector<int64_t>& ids, int64_t index, int64_t parent,
                                     const BlockManager& blocks) const {
  Key key;
  key.parent = parent;
  key.parent_takes = parent >= 0 ? blocks.takes(parent) : 0;
  key.ids.assign(ids.begin() + index * block_size_, ids.begin() + (index + 1) * block_size_);
  return key;
}

bool PrefixCache::live(const Record& r, const BlockManager& blocks) {
  return r.block < blocks.num_blocks() && blocks.takes(r.block) == r.takes &&
         (blocks.references(r.block) > 0 || blocks.retained(r.block));
}

std::vector<int64_t> PrefixCache::find(const std::vector<int64_t>& ids, const BlockManager& blocks) const {
  HF_CHECK(blocks.block_size() == block_size_, "prefix cache: blocks of ", block_size_, " positions, the pool's are ",
           blocks.block_size());
  std::vector<int64_t> found;
  int64_t parent = -1;
  for (int64_t j = 0; (j + 1) * block_size_ < static_cast<int64_t>(ids.size()); ++j) {
    const auto at = records_.find(key_of(ids, j, parent, blocks));
    if (at == records_.end() || !live(at->second, blocks)) break;
    found.push_back(at->second.block);
    parent = at->second.block;
  }
  return found;
}

int64_t PrefixCache::blocks_in_common(const std::vector<int64_t>& ids, const std::vector<int64_t>& other) const {
  if (ids.empty()) return 0;
  const auto shorter = static_cast<std::ptrdiff_t>(std::min(ids.size(), other.size()));
  const int64_t same = std::mismatch(ids.begin(), ids.begin() + shorter, other.begin()).first - ids.begin();
  return std::min<int64_t>(same, static_cast<int64_t>(ids.size()) - 1) / block_size_;
}

void PrefixCache::record(const std::vector<int64_t>& ids, const std::vector<int64_t>& table, int64_t full,
                         BlockManager& blocks) {
  HF_CHECK(full >= 0 && full <= static_cast<int64_t>(table.size()) &&
               full * block_size_ <= static_cast<int64_t>(ids.size()),
           "prefix cache: ", full, " full blocks of ", block_size_, " positions for ", ids.size(), " ids in a table of ",
           table.size(), " blocks");
  if (records_.size() > static_cast<size_t>(2 * blocks.num_blocks() + 64)) prune(blocks);
  int64_t parent = -1;
  for (int64_t j = 0; j < full; ++j) {
    const int64_t block = table[static_cast<size_t>(j)];
    const Record mine{block, blocks.takes(block)};
    HF_CHECK(blocks.references(block) > 0, "prefix cache: block ", block, " is not held");
    auto [at, added] = records_.try_emplace(key_of(ids, j, parent, blocks), mine);
    if (!added) {
      if (!live(at->second, blocks)) {
        at->second = mine;
      } else if (at->second.block != block) {
        return;  // another block holds these ids after the same prefix; later contexts follow that chain
      }
    }
    if (retain_freed_) blocks.keep_contents(block);  // found after its sequences end, until its block is needed
    parent = block;
  }
}

void PrefixCache::prune(const BlockManager& blocks) {
  std::erase_if(records_, [&](const auto& entry) { return !live(entry.second, blocks); });
}

}  // namespace hybridflow
