// The paged KV cache's tensor side: block copies and a prefill's keys and values into blocks; see
// transformer.h (PagedKVCache). Device-agnostic torch operations: one gather and one scatter per layer.
#include <algorithm>
#include <vector>

#include "hybridflow/core/device_upload.h"
#include "hybridflow/core/error.h"
#include "hybridflow/model/transformer.h"

namespace hybridflow {

int64_t PagedKVCache::block_bytes() const {
  int64_t bytes = 0;
  for (const auto* pools : {&keys, &values})
    for (const auto& pool : *pools) bytes += pool.numel() / pool.size(0) * static_cast<int64_t>(pool.element_size());
  return bytes;
}

void PagedKVCache::copy_block(int64_t from, int64_t to) {
  for (auto* pools : {&keys, &values})
    for (auto& pool : *pools) pool[to].copy_(pool[from]);
}

void PagedKVCache::write_prefill(const KVCache& prefill, const std::vector<std::vector<int64_t>>& tables,
                                 const std::vector<int64_t>& lengths, const std::vector<int64_t>& starts,
                                 const std::vector<int64_t>& shifts) {
  HF_CHECK(prefill.keys.size() == keys.size() && tables.size() == lengths.size() &&
               (starts.empty() || starts.size() == lengths.size()) && (shifts.empty() || shifts.size() == lengths.size()),
           "PagedKVCache::write_prefill: a prefill of ", prefill.keys.size(), " layers into pools of ", keys.size(),
           ", with ", tables.size(), " block tables, ", starts.size(), " starts and ", shifts.size(), " shifts for ",
           lengths.size(), " rows");
  if (keys.empty()) return;
  const int64_t kv = keys[0].size(1), bs = block_size(), d = keys[0].size(3);
  const int64_t width = prefill.keys[0].size(2);  // positions per prefill row in its slab
  // Pool row (block * kv + h) * bs + p % bs takes slab row (i * kv + h) * width + p, both viewed as [-1, d].
  std::vector<int64_t> to, from;
  for (size_t i = 0; i < tables.size(); ++i) {
    const int64_t start = starts.empty() ? 0 : starts[i];
    const int64_t shift = shifts.empty() ? 0 : shifts[i];
    HF_CHECK(start + shift >= 0 && lengths[i] + shift <= width && static_cast<int64_t>(tables[i].size()) * bs >= lengths[i],
             "PagedKVCache::write_prefill: row ", i, " has positions [", start, ", ", lengths[i], ") at slab shift ",
             shift, " for a prefill of ", width, " and ", tables[i].size(), " blocks of ", bs);
    for (int64_t h = 0; h < kv; ++h)
      for (int64_t p = start; p < lengths[i]; ++p) {
        to.push_back((tables[i][static_cast<size_t>(p / bs)] * kv + h) * bs + p % bs);
        from.push_back((static_cast<int64_t>(i) * kv + h) * width + p + shift);
      }
  }
  const auto device = keys[0].device();
  // Pinned, queued behind the device's work: an admission does not wait for the running rows' decode.
  const auto to_t = upload(torch::tensor(to, torch::kInt64), device);
  const auto from_t = upload(torch::tensor(from, torch::kInt64), device);
  for (size_t l = 0; l < keys.size(); ++l) {
    keys[l].view({-1, d}).index_copy_(0, to_t, prefill.keys[l].reshape({-1, d}).index_select(0, from_t));
    values[l].view({-1, d}).index_copy_(0, to_t, prefill.values[l].reshape({-1, d}).index_select(0, from_t));
  }
}

KVCache PagedKVCache::gather(const std::vector<std::vector<int64_t>>& tables, const std::vector<int64_t>& lengths,
                             int64_t capacity) const {
  HF_CHECK(tables.size() == lengths.size(), "PagedKVCache::gather: ", tables.size(), " block tables for ", lengths.size(),
           " lengths");
  int64_t longest = 0;
  for (size_t r = 0; r < tables.size(); ++r) {
    HF_CHECK(lengths[r] >= 0 && static_cast<int64_t>(tables[r].size()) * block_size() >= lengths[r],
             "PagedKVCache::gather: row ", r, " has ", lengths[r], " positions in ", tables[r].size(), " blocks of ",
             block_size());
    longest = std::max(longest, lengths[r]);
  }
  HF_CHECK(capacity >= longest, "PagedKVCache::gather: a capacity of ", capacity, " positions for rows of up to ", longest);
  KVCache out;
  out.filled = longest;
  out.capacity = capacity;
  if (keys.empty() || longest == 0) return out;
  const auto rows = static_cast<int64_t>(tables.size());
  const int64_t kv = keys[0].size(1), bs = block_size(), d = keys[0].size(3);
  // Slab row (r * kv + h) * capacity + longest - lengths[r] + p takes pool row (block * kv + h) * bs + p % bs,
  // both viewed as [-1, d]: one gather and one scatter per layer, straight into the slab.
  std::vector<int64_t> to, from;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<int64_t>& table = tables[static_cast<size_t>(r)];
    const int64_t length = lengths[static_cast<size_t>(r)];
    for (int64_t h = 0; h < kv; ++h)
      for (int64_t p = 0; p < length; ++p) {
        from.push_back((table[static_cast<size_t>(p / bs)] * kv + h) * bs + p % bs);
        to.push_back((r * kv + h) * capacity + longest - length + p);
      }
  }
  const auto device = keys[0].device();
  const auto to_t = upload(torch::tensor(to, torch::kInt64), device);
  const auto from_t = upload(torch::tensor(from, torch::kInt64), device);
  const auto one_slab = [&](const torch::Tensor& pool) {
    auto slab = torch::empty({rows, kv, capacity, d}, pool.options());
    for (int64_t r = 0; r < rows; ++r)
      if (lengths[static_cast<size_t>(r)] < longest) slab[r].narrow(1, 0, longest - lengths[static_cast<size_t>(r)]).zero_();
    slab.view({-1, d}).index_copy_(0, to_t, pool.view({-1, d}).index_select(0, from_t));
    return slab;
  };
  for (size_t l = 0; l < keys.size(); ++l) {
    out.keys.push_back(one_slab(keys[l]));
    out.values.push_back(one_slab(values[l]));
  }
  return out;
}

}  // namespace hybridflow
