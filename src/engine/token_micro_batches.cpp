#include "hybridflow/engine/token_micro_batches.h"

#include <algorithm>
#include <numeric>

#include "hybridflow/core/error.h"

namespace hybridflow {
namespace {

bool is_sequence_key(const std::string& key) {
  // routed_experts [B, L, layers, k]: router replay's experts of every token (workers/router_replay.h).
  return key == "input_ids" || key == "attention_mask" || key == "position_ids" || key == "routed_experts";
}

// Response width R (0 without tensor `responses`) and sequence length L of an RL batch.
struct Widths {
  int64_t response = 0, sequence = 0;
  int64_t prompt() const { return sequence - response; }
};

Widths widths_of(const DataProto& batch) {
  HF_CHECK(batch.has_tensor("attention_mask") && batch.tensor("attention_mask").dim() == 2,
           "micro-batches by token count need tensor attention_mask [B, L], got ", batch.summary());
  Widths w;
  w.sequence = batch.tensor("attention_mask").size(1);
  if (batch.has_tensor("responses")) w.response = batch.tensor("responses").size(1);
  HF_CHECK(w.response < w.sequence, "micro-batches by token count: responses of width ", w.response,
           " leave no prompt in sequences of length ", w.sequence);
  return w;
}

// Columns [start, end) of each row that hold a token, widened so that at least one prompt and one
// response column stay (the log-prob and value windows need both).
struct Spans {
  std::vector<int64_t> start, end;
};

Spans spans_of(const DataProto& batch) {
  const Widths w = widths_of(batch);
  torch::Tensor used = batch.tensor("attention_mask").to(torch::kCPU).ne(0);
  if (w.response > 0 && batch.has_tensor("response_mask")) {
    // A response token the loss counts is kept even where the attention mask says otherwise.
    torch::Tensor loss_cols = batch.tensor("response_mask").to(torch::kCPU).ne(0);
    used.narrow(1, w.prompt(), w.response).logical_or_(loss_cols);
  }
  const int64_t rows = used.size(0), length = used.size(1);
  const auto columns = torch::arange(length, torch::kLong).unsqueeze(0);
  // First used column (length when none) and one past the last (0 when none).
  const torch::Tensor first = torch::where(used, columns, torch::full_like(columns, length)).amin(1).contiguous();
  const torch::Tensor last = torch::where(used, columns + 1, torch::zeros_like(columns)).amax(1).contiguous();
  const auto first_of = first.accessor<int64_t, 1>();
  const auto last_of = last.accessor<int64_t, 1>();
  Spans s;
  for (int64_t i = 0; i < rows; ++i) {
    int64_t start = first_of[i], end = last_of[i];
    if (w.response > 0) {
      start = std::min(start, w.prompt() - 1);
      end = std::max(end, w.prompt() + 1);
    } else if (end <= start) {  // a row without tokens keeps one column
      start = std::min(start, length - 1);
      end = start + 1;
    }
    s.start.push_back(start);
    s.end.push_back(end);
  }
  return s;
}

}  // namespace

RowLengths row_lengths(const DataProto& batch) {
  const Widths w = widths_of(batch);
  const Spans s = spans_of(batch);
  RowLengths out;
  for (size_t i = 0; i < s.start.size(); ++i) {
    const int64_t split = w.response > 0 ? w.prompt() : s.end[i];
    out.prompt.push_back(split - s.start[i]);
    out.response.push_back(s.end[i] - split);
  }
  return out;
}

namespace {

// Halves the group of most rows (the first of them) until there are at_least groups; a part of a group stays
// within its budget. at_least > rows is an error naming `key`.
void halve_largest_groups(std::vector<std::vector<int64_t>>& groups, int64_t at_least, int64_t rows,
                          const std::string& key) {
  HF_CHECK(at_least <= rows, key, ": ", at_least, " micro-batches asked of ", rows,
           " rows (every rank of an expert-parallel group runs as many micro-batches as the one of most)");
  while (static_cast<int64_t>(groups.size()) < at_least) {
    const auto largest = std::max_element(groups.begin(), groups.end(),
                                          [](const auto& a, const auto& b) { return a.size() < b.size(); });
    std::vector<int64_t> second(largest->begin() + static_cast<std::ptrdiff_t>(largest->size() / 2), largest->end());
    largest->resize(largest->size() / 2);
    groups.insert(largest + 1, std::move(second));
  }
}

}  // namespace

std::vector<std::vector<int64_t>> token_budget_groups(const RowLengths& lengths, int64_t max_tokens,
                                                      const std::string& key, int64_t at_least) {
  HF_CHECK(max_tokens > 0, key, " must be > 0 tokens, got ", max_tokens);
  HF_CHECK(lengths.prompt.size() == lengths.response.size(), "token_budget_groups: ", lengths.prompt.size(),
           " prompt lengths for ", lengths.response.size(), " responses");
  const size_t rows = lengths.prompt.size();
  auto total = [&](size_t i) { return lengths.prompt[i] + lengths.response[i]; };
  std::vector<int64_t> order(rows);
  std::iota(order.begin(), order.end(), 0);
  // Longest first; equal lengths keep batch order, so the grouping is the same on every rank.
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return total(static_cast<size_t>(a)) > total(static_cast<size_t>(b)); });
  std::vector<std::vector<int64_t>> groups;
  int64_t prompt = 0, response = 0;  // the open group's longest of each
  for (int64_t row : order) {
    const auto i = static_cast<size_t>(row);
    HF_CHECK(total(i) <= max_tokens, key, " = ", max_tokens, " tokens is less than one sequence of this batch (",
             lengths.prompt[i], " prompt + ", lengths.response[i],
             " response tokens); raise it to at least the longest prompt + response, as verl requires");
    const int64_t width = std::max(prompt, lengths.prompt[i]) + std::max(response, lengths.response[i]);
    if (groups.empty() || static_cast<int64_t>(groups.back().size() + 1) * width > max_tokens) {
      groups.emplace_back();
      prompt = response = 0;
    }
    groups.back().push_back(row);
    prompt = std::max(prompt, lengths.prompt[i]);
    response = std::max(response, lengths.response[i]);
  }
  halve_largest_groups(groups, at_least, static_cast<int64_t>(rows), key);
  return groups;
}

DataProto trimmed_rows(const DataProto& batch, const torch::Tensor& rows) {
  DataProto sub = batch.index_select(rows);
  const Widths w = widths_of(sub);
  const Spans s = spans_of(sub);
  const int64_t start = *std::min_element(s.start.begin(), s.start.end());
  const int64_t end = *std::max_element(s.end.begin(), s.end.end());
  DataProto out = sub;
  for (const auto& [key, t] : sub.tensors()) {
    if (t.dim() < 2) continue;
    if (is_sequence_key(key)) {
      HF_CHECK(t.size(1) == w.sequence, "micro-batches by token count: tensor ", key, " has ", t.size(1),
               " columns, attention_mask ", w.sequence);
      out.set_tensor(key, t.narrow(1, start, end - start));
    } else if (w.response > 0 && key == "prompts") {
      HF_CHECK(t.size(1) == w.prompt(), "micro-batches by token count: tensor prompts has ", t.size(1),
               " columns, the sequences' prompt part ", w.prompt());
      out.set_tensor(key, t.narrow(1, start, w.prompt() - start));
    } else if (w.response > 0 && t.size(1) == w.response) {
      out.set_tensor(key, t.narrow(1, 0, end - w.prompt()));
    }
  }
  return out;
}

std::vector<MicroBatch> split_micro_batches(const DataProto& batch, const MicroBatching& how) {
  const int64_t rows = batch.batch_size();
  HF_CHECK(rows > 0, "micro-batches of an empty batch");
  std::vector<MicroBatch> out;
  if (!how.by_tokens()) {
    HF_CHECK(how.rows > 0, "micro-batch size must be > 0, got ", how.rows);
    for (int64_t begin = 0; begin < rows; begin += how.rows) {
      const int64_t end = std::min(rows, begin + how.rows);
      out.push_back({batch.slice(begin, end), torch::arange(begin, end, torch::kLong)});
    }
    return out;
  }
  std::vector<std::vector<int64_t>> groups = token_budget_groups(row_lengths(batch), how.max_tokens, how.key);
  if (how.agree_count) halve_largest_groups(groups, how.agree_count(static_cast<int64_t>(groups.size())), rows, how.key);
  for (const auto& group : groups) {
    torch::Tensor index = torch::tensor(group, torch::kLong);
    out.push_back({trimmed_rows(batch, index), index});
  }
  return out;
}

torch::Tensor merge_micro_results(const std::vector<MicroBatch>& micro_batches, const std::vector<torch::Tensor>& parts,
                                  int64_t width) {
  HF_CHECK(parts.size() == micro_batches.size(), "merge_micro_results: ", parts.size(), " results for ",
           micro_batches.size(), " micro-batches");
  std::vector<torch::Tensor> padded, rows;
  for (size_t i = 0; i < parts.size(); ++i) {
    const torch::Tensor& part = parts[i];
    if (!part.defined()) return torch::Tensor();  // a pipeline stage before the last
    HF_CHECK(part.dim() >= 1 && part.size(0) == micro_batches[i].rows.size(0), "merge_micro_results: micro-batch ", i,
             " of ", micro_batches[i].rows.size(0), " rows gave a result of shape ", part.sizes());
    if (part.dim() >= 2 && part.size(1) < width) {
      auto sizes = part.sizes().vec();
      sizes[1] = width;
      torch::Tensor full = torch::zeros(sizes, part.options());
      full.narrow(1, 0, part.size(1)).copy_(part);
      padded.push_back(full);
    } else {
      padded.push_back(part);
    }
    rows.push_back(micro_batches[i].rows.to(part.device()));
  }
  torch::Tensor all = torch::cat(padded, 0);
  torch::Tensor index = torch::cat(rows, 0);
  // Micro-batches in batch order (the padded path) are already in place.
  if (torch::equal(index, torch::arange(index.size(0), index.options()))) return all;
  return torch::zeros_like(all).index_copy_(0, index, all);
}

int64_t result_width(const DataProto& batch) {
  if (batch.has_tensor("responses")) return batch.tensor("responses").size(1);
  return batch.has_tensor("attention_mask") ? batch.tensor("attention_mask").size(1) : 0;
}

}  // namespace hybridflow
