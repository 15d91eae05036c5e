// Padding-free packing (verl's use_remove_padding): the real tokens of a batch's rows laid end to end in one
// row, so projections, MLP and head compute no padding at all. The packed attention mask numbers the
// sequences 1, 2, ... (the model confines attention to each: transformer.h), and positions restart at 0 for
// each sequence, so every token's hidden state is the padded path's up to float rounding.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "hybridflow/engine/log_probs.h"
#include "hybridflow/model/transformer.h"

namespace hybridflow {

struct PackedRows {
  torch::Tensor input_ids;       // [1, N]: the N real tokens, row after row
  torch::Tensor attention_mask;  // [1, N]: row b's tokens hold b + 1
  torch::Tensor position_ids;    // [1, N]: 0, 1, ... within each row
  torch::Tensor index;           // [B, T] int64: a padded position's place in the packed row; -1 on padding
};

// input_ids and attention_mask [B, T] (1 = real token, 0 = padding; a row's real tokens need not be contiguous).
PackedRows pack_rows(const torch::Tensor& input_ids, const torch::Tensor& attention_mask);

// The packed row's values at padded positions `positions` [B, W] (int64 in [0, T)): [B, W, ...] taken from
// packed [1, N, ...]; positions on padding get zeros.
torch::Tensor unpack_positions(const torch::Tensor& packed, const PackedRows& rows, const torch::Tensor& positions);

// response_log_probs (model_log_probs.h) on the packed rows: the same [B, R] log-probs and entropy (and sum of
// p^2) at every position whose response token is real; 0 where it is padding.
TokenLogProbs packed_response_log_probs(CausalLM& model, const torch::Tensor& input_ids,
                                        const torch::Tensor& attention_mask, int64_t response_len,
                                        double temperature = 1.0, bool with_entropy = true,
                                        bool with_sum_pi_squared = false);

// The value head's [B, T] values on the packed rows (0 on padding): forward().values of the padded path.
torch::Tensor packed_values(CausalLM& model, const torch::Tensor& input_ids, const torch::Tensor& attention_mask);

}  // namespace hybridflow
