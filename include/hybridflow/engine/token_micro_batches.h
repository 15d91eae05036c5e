// Micro-batches by token count (verl's use_dynamic_bsz with *_max_token_len_per_gpu): padding costs no
// compute. The rows of a batch are sorted by length and cut into micro-batches whose padded size stays
// within a token budget, and each micro-batch is cut to its own longest prompt and longest response, so a
// short answer never runs to the longest answer's length. Every per-row result is that of the padded path
// (attention never sees padding, positions follow the attention mask); only float rounding differs.
//
// The RL batch layout (workers/rl_batch.h): input_ids / attention_mask (and position_ids, if present)
// [B, P + R] = prompt (left padded) + response (right padded); prompts [B, P]; every other tensor with at
// least 2 dims whose dim 1 is R (the width of tensor `responses`) is response-shaped (responses,
// response_mask, advantages, old_log_probs, values, ...). A batch without `responses` is sequences only
// (R = 0), trimmed at both ends.
//
// Sorting by length and trimming leaves little padding; use_remove_padding removes the rest by running each
// micro-batch as one packed row (engine/packed_rows.h), whose sequences attend one by one, so a packed row
// of k sequences pays their own attention, not k^2 times one sequence's as a dense block-diagonal mask would.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hybridflow/core/data_proto.h"

namespace hybridflow {

// How a pass splits its batch: `max_tokens` > 0 forms micro-batches by token count (`rows` is then unused),
// else fixed micro-batches of `rows` rows in batch order (the padded path).
struct MicroBatching {
  int64_t rows = 0;
  int64_t max_tokens = 0;
  std::string key;  // the config key of max_tokens, named in errors
  // By tokens, when set: given the number of micro-batches the budget formed, the number to run (at least that
  // many, at most the rows; the largest are halved to get there). For ranks that must run as many as each
  // other: expert parallelism exchanges tokens in every forward and backward, so this is a collective there.
  std::function<int64_t(int64_t)> agree_count = nullptr;
  bool by_tokens() const { return max_tokens > 0; }
};

struct MicroBatch {
  DataProto data;     // the rows, trimmed when formed by tokens
  torch::Tensor rows;  // [b] int64: their indices in the batch
};

// Per row of an RL batch: prompt tokens (prompt width minus its leading padding) and response extent
// (columns up to its last real response token).
struct RowLengths {
  std::vector<int64_t> prompt, response;
};
RowLengths row_lengths(const DataProto& batch);

// Row groups, longest rows first, each within max_tokens padded tokens: rows x (the group's longest prompt
// + longest response). Every row is in exactly one group. A row that alone exceeds max_tokens is an error
// naming `key`. With at_least > the groups formed, the group of most rows (the first of them) is halved
// until there are at_least groups (a part of a group stays within its budget); at_least > rows is an error.
std::vector<std::vector<int64_t>> token_budget_groups(const RowLengths& lengths, int64_t max_tokens,
                                                      const std::string& key, int64_t at_least = 0);

// The given rows of an RL batch with every sequence-, prompt- and response-shaped tensor cut to the columns
// one of those rows uses (at least one prompt and one response column stay).
DataProto trimmed_rows(const DataProto& batch, const torch::Tensor& rows);

// The micro-batches of `batch` as `how` says; by tokens each is trimmed (trimmed_rows).
std::vector<MicroBatch> split_micro_batches(const DataProto& batch, const MicroBatching& how);

// The inverse for per-row results: parts[i] holds micro_batches[i]'s rows ([b_i] or [b_i, w_i, ...] with
// w_i <= width); returns them in batch order, dim 1 zero-padded back to `width` where a part has one.
torch::Tensor merge_micro_results(const std::vector<MicroBatch>& micro_batches, const std::vector<torch::Tensor>& parts,
                                  int64_t width);

// The width results of `batch` are padded back to: its response width R, else its sequence length.
int64_t result_width(const DataProto& batch);

}  // namespace hybridflow
