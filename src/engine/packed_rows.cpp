#include "hybridflow/engine/packed_rows.h"

#include "hybridflow/core/error.h"
#include "hybridflow/engine/head_log_probs.h"

namespace hybridflow {

PackedRows pack_rows(const torch::Tensor& input_ids, const torch::Tensor& attention_mask) {
  HF_CHECK(input_ids.dim() == 2 && attention_mask.sizes() == input_ids.sizes(), "pack_rows: input_ids ",
           input_ids.sizes(), " and attention_mask ", attention_mask.sizes(), " must both be [B, T]");
  const auto device = input_ids.device();
  const torch::Tensor real = attention_mask.to(device).ne(0);
  const int64_t b = input_ids.size(0), t = input_ids.size(1);
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(device);
  PackedRows rows;
  // Row-major order of the real positions is row after row, each in position order.
  const torch::Tensor flat_real = real.reshape({-1});
  const torch::Tensor where = flat_real.nonzero().squeeze(1);  // [N] flat indices b * T + j
  const int64_t n = where.size(0);
  HF_CHECK(n > 0, "pack_rows: the batch holds no real token");
  rows.input_ids = input_ids.reshape({-1}).index_select(0, where).unsqueeze(0);
  const torch::Tensor row_of = torch::div(where, t, "floor");
  rows.attention_mask = (row_of + 1).unsqueeze(0);
  // Position within the row: the count of real tokens before it in its row.
  const torch::Tensor count = real.to(torch::kInt64).cumsum(1) - 1;  // [B, T]
  rows.position_ids = count.reshape({-1}).index_select(0, where).unsqueeze(0);
  rows.index = torch::full({b * t}, -1, i64).index_copy(0, where, torch::arange(n, i64)).view({b, t});
  return rows;
}

torch::Tensor unpack_positions(const torch::Tensor& packed, const PackedRows& rows, const torch::Tensor& positions) {
  HF_CHECK(packed.dim() >= 2 && packed.size(0) == 1, "unpack_positions: packed must be [1, N, ...], got ",
           packed.sizes());
  const torch::Tensor index = rows.index.gather(1, positions.to(rows.index.device()));  // [B, W]
  const torch::Tensor on_padding = index.lt(0);
  auto picked = packed.squeeze(0).index_select(0, index.clamp_min(0).reshape({-1}));
  auto sizes = index.sizes().vec();
  for (int64_t d = 2; d < packed.dim(); ++d) sizes.push_back(packed.size(d));
  picked = picked.view(sizes);
  auto keep = on_padding.logical_not();
  for (int64_t d = 2; d < packed.dim(); ++d) keep = keep.unsqueeze(-1);
  return picked * keep.to(picked.scalar_type());
}

TokenLogProbs packed_response_log_probs(CausalLM& model, const torch::Tensor& input_ids,
                                        const torch::Tensor& attention_mask, int64_t response_len, double temperature,
                                        bool with_entropy, bool with_sum_pi_squared) {
  check_response_window(input_ids, response_len, temperature);
  const int64_t total = input_ids.size(1);
  const PackedRows rows = pack_rows(input_ids, attention_mask);
  const torch::Tensor hidden = model->hidden_states(rows.input_ids, rows.attention_mask, rows.position_ids);
  // Response token r (position L - R + r) is scored at position L - R - 1 + r; both must be real.
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(input_ids.device());
  const torch::Tensor scoring = torch::arange(total - response_len - 1, total - 1, i64).expand({input_ids.size(0), response_len});
  const torch::Tensor scored_real = rows.index.narrow(1, total - response_len, response_len).ge(0) &
                                    rows.index.gather(1, scoring).ge(0);
  const torch::Tensor window = unpack_positions(hidden, rows, scoring);  // [B, R, H]
  TokenLogProbs out = head_log_probs(window, model->lm_head_weight(), input_ids.narrow(1, total - response_len, response_len),
                                     temperature, with_entropy, model->tensor_parallel(), /*chunk_tokens=*/0,
                                     with_sum_pi_squared);
  const torch::Tensor keep = scored_real.to(torch::kFloat32);
  out.log_probs = out.log_probs * keep;
  if (out.entropy.defined()) out.entropy = out.entropy * keep;
  if (out.sum_pi_squared.defined()) out.sum_pi_squared = out.sum_pi_squared * keep;
  return out;
}

torch::Tensor packed_values(CausalLM& model, const torch::Tensor& input_ids, const torch::Tensor& attention_mask) {
  const PackedRows rows = pack_rows(input_ids, attention_mask);
  const torch::Tensor values =
      model->forward(rows.input_ids, rows.attention_mask, rows.position_ids).values;  // [1, N]
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(input_ids.device());
  const torch::Tensor every = torch::arange(input_ids.size(1), i64).expand({input_ids.size(0), input_ids.size(1)});
  return unpack_positions(values, rows, every);
}

}  // namespace hybridflow
