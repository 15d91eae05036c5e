#include "hybridflow/engine/decode_graph_plan.h"

#include <algorithm>
#include <bit>

#include "hybridflow/core/error.h"

namespace hybridflow {

int64_t quarter_octave_bucket(int64_t n, int64_t step, int64_t exact) {
  if (n <= exact) return n;
  const auto below = static_cast<int64_t>(std::bit_floor(static_cast<uint64_t>(n - 1)));
  const int64_t quarter = std::max(step, (below / 4 + step - 1) / step * step);
  return (n + quarter - 1) / quarter * quarter;
}

DecodeGraphPlan::DecodeGraphPlan(Options options) : options_(options) {
  HF_CHECK(options_.block_size > 0 && options_.max_rows > 0 && options_.max_span > 0 && options_.max_graphs >= 0 &&
               options_.reuse_factor >= 1 && options_.span_headroom >= 1,
           "decode graphs: block_size, max_rows and max_span must be positive, max_graphs >= 0, reuse_factor and ",
           "span_headroom >= 1, got ", options_.block_size, ", ", options_.max_rows, ", ", options_.max_span, ", ",
           options_.max_graphs, ", ", options_.reuse_factor, ", ", options_.span_headroom);
}

DecodeGraphBucket DecodeGraphPlan::bucket(int64_t rows, int64_t longest) const {
  HF_CHECK(rows > 0 && longest > 0, "decode graphs: a step needs rows and positions, got ", rows, " rows, ", longest,
           " positions");
  if (rows > options_.max_rows) return {};
  // Powers of two up to 8 rows (the few-row steps of a rollout's tail), then quarter octaves of 8 or more.
  const int64_t bucket_rows = rows <= 8 ? static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(rows)))
                                        : quarter_octave_bucket(rows, 8, 0);
  const int64_t bs = options_.block_size;
  const auto whole_blocks = [bs](int64_t n) { return (n + bs - 1) / bs * bs; };
  const int64_t span = quarter_octave_bucket(whole_blocks(longest), bs, 0);
  return {std::min(bucket_rows, options_.max_rows),
          std::min(span, std::max(whole_blocks(options_.max_span), whole_blocks(longest)))};
}

DecodeGraphPlan::Decision DecodeGraphPlan::decide(int64_t rows, int64_t longest) const {
  const DecodeGraphBucket own = bucket(rows, longest);
  if (own.rows == 0) return {};
  if (captured_.count(own) > 0) return {Action::kReplay, own};
  // The set is ordered by rows, then span: the first graph that holds the step pads it least in rows.
  const int64_t most_rows = own.rows * options_.reuse_factor;
  const int64_t most_span = own.span * options_.reuse_factor * options_.span_headroom;
  for (const DecodeGraphBucket& graph : captured_) {
    if (graph.rows > most_rows) break;
    if (graph.rows >= own.rows && graph.span >= own.span && graph.span <= most_span) return {Action::kReplay, graph};
  }
  if (graphs() >= options_.max_graphs) return {};
  const int64_t bs = options_.block_size;
  const int64_t span_cap = std::max((options_.max_span + bs - 1) / bs * bs, own.span);
  return {Action::kCapture, {own.rows, std::min(own.span * options_.span_headroom, span_cap)}};
}

PaddedDecodeStep DecodeGraphPlan::pad(const DecodeGraphBucket& bucket, const std::vector<int64_t>& tokens,
                                      const std::vector<std::vector<int64_t>>& tables,
                                      const std::vector<int64_t>& lengths, int64_t pad_block, int64_t pad_token) const {
  HF_CHECK(tables.size() == tokens.size(), "decode graphs: ", tokens.size(), " rows with ", tables.size(), " tables");
  std::vector<const std::vector<int64_t>*> refs;
  for (const auto& table : tables) refs.push_back(&table);
  const int64_t n = bucket.rows, width = bucket.span / options_.block_size;
  std::vector<int64_t> flat(static_cast<size_t>(std::max<int64_t>(n, 0) * (2 + std::max<int64_t>(width, 0))));
  write_padded(bucket, tokens.data(), refs, lengths, pad_block, pad_token, flat.data());
  PaddedDecodeStep step;
  step.tokens.assign(flat.begin(), flat.begin() + n);
  step.lengths.assign(flat.begin() + n, flat.begin() + 2 * n);
  step.tables.assign(flat.begin() + 2 * n, flat.end());
  return step;
}

void DecodeGraphPlan::write_padded(const DecodeGraphBucket& bucket, const int64_t* tokens,
                                   const std::vector<const std::vector<int64_t>*>& tables,
                                   const std::vector<int64_t>& lengths, int64_t pad_block, int64_t pad_token,
                                   int64_t* out) const {
  const auto rows = static_cast<int64_t>(tables.size());
  const int64_t bs = options_.block_size, n = bucket.rows, width = bucket.span / bs;
  HF_CHECK(static_cast<int64_t>(lengths.size()) == rows && rows <= n && bucket.span % bs == 0,
           "decode graphs: ", rows, " rows (", tables.size(), " tables, ", lengths.size(),
           " lengths) do not fit a bucket of ", n, " rows and ", bucket.span, " positions");
  int64_t* out_tokens = out;
  int64_t* out_lengths = out + n;
  int64_t* out_tables = out + 2 * n;
  for (int64_t r = 0; r < rows; ++r) {
    const auto i = static_cast<size_t>(r);
    const std::vector<int64_t>& table = *tables[i];
    HF_CHECK(lengths[i] >= 0 && lengths[i] < bucket.span && lengths[i] / bs < static_cast<int64_t>(table.size()),
             "decode graphs: row ", r, " at position ", lengths[i], " with a table of ", table.size(),
             " blocks does not fit a span of ", bucket.span, " positions");
    out_tokens[r] = tokens != nullptr ? tokens[r] : pad_token;
    out_lengths[r] = lengths[i];
    const auto used = std::min(width, static_cast<int64_t>(table.size()));
    int64_t* row_table = out_tables + r * width;
    std::copy_n(table.begin(), used, row_table);
    std::fill(row_table + used, row_table + width, pad_block);
  }
  std::fill(out_tokens + rows, out_tokens + n, pad_token);
  std::fill(out_lengths + rows, out_lengths + n, int64_t{0});
  std::fill(out_tables + rows * width, out_tables + n * width, pad_block);
}

}  // namespace hybridflow
