// The tensor layout of an RL batch, shared by the trainer and the workers: prompts left padded,
// responses right padded to a fixed response_length (so every rank's output concatenates), and
// input_ids / attention_mask = prompt followed by response.
#pragma once

#include <cstdint>
#include <vector>

#include "hybridflow/core/data_proto.h"
#include "hybridflow/engine/generation.h"

namespace hybridflow {

// Tensors input_ids / attention_mask [B, max prompt length], left padded with pad_id.
DataProto make_prompt_batch(const std::vector<std::vector<int64_t>>& prompts, int64_t pad_id);

// The real tokens of each prompt row: from tensors input_ids + attention_mask, or from field prompt_ids.
std::vector<std::vector<int64_t>> prompt_token_lists(const DataProto& in);

// prompts, responses, response_mask (padded to response_length), input_ids, attention_mask, rollout_log_probs.
DataProto rollout_batch(const GenerationOutput& out, int64_t response_length, int64_t pad_id);

// Per-sequence scores [B] placed at the last valid response token of a [B, R] tensor (the rest 0):
// the token_level_scores the advantage estimators expect. A row without response tokens gets nothing.
torch::Tensor scores_at_last_token(const torch::Tensor& scores, const torch::Tensor& response_mask);

// Index [B] of the last position where mask [B, T] is 1 (0 for an all-zero row).
torch::Tensor last_valid_index(const torch::Tensor& mask);

}  // namespace hybridflow
