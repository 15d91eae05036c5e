// One prefill forward's inputs over rows with cached prefixes; see engine/generation_steps.h.
#include <algorithm>

#include "engine/generation_steps.h"
#include "hybridflow/core/error.h"

namespace hybridflow::generation {

PrefillRows prefill_rows(const std::vector<const std::vector<int64_t>*>& contexts, const std::vector<int64_t>& cached,
                         int64_t pad_id) {
  HF_CHECK(contexts.size() == cached.size(), "prefill_rows: ", contexts.size(), " contexts with ", cached.size(),
           " cached lengths");
  PrefillRows out;
  const auto rows = static_cast<int64_t>(contexts.size());
  for (int64_t r = 0; r < rows; ++r) {
    const auto length = static_cast<int64_t>(contexts[static_cast<size_t>(r)]->size());
    const int64_t from = cached[static_cast<size_t>(r)];
    HF_CHECK(from >= 0 && from < length, "prefill_rows: row ", r, " has ", length, " ids of which ", from,
             " are cached; at least its last one must be new");
    out.past = std::max(out.past, from);
    out.width = std::max(out.width, length - from);
  }
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  out.ids = torch::full({rows, out.width}, pad_id, i64);
  out.mask = torch::zeros({rows, out.past + out.width}, i64);
  out.positions = torch::zeros({rows, out.width}, i64);
  auto id = out.ids.accessor<int64_t, 2>();
  auto m = out.mask.accessor<int64_t, 2>();
  auto at = out.positions.accessor<int64_t, 2>();
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<int64_t>& context = *contexts[static_cast<size_t>(r)];
    const int64_t from = cached[static_cast<size_t>(r)];
    const int64_t fresh = static_cast<int64_t>(context.size()) - from;
    for (int64_t t = out.past - from; t < out.past; ++t) m[r][t] = 1;
    for (int64_t t = 0; t < out.width; ++t) {
      if (t < fresh) {
        id[r][t] = context[static_cast<size_t>(from + t)];
        m[r][out.past + t] = 1;
      }
      at[r][t] = from + std::min(t, fresh - 1);
    }
    out.last.push_back(fresh - 1);
    out.shifts.push_back(out.past - from);
  }
  return out;
}

}  // namespace hybridflow::generation
