// Padding-free packing (engine/packed_rows.h): the real tokens of left- and right-padded rows in one row, with
// attention confined to each sequence and positions restarting, give the padded path's response log-probs,
// entropy and values, and the same gradients, within 1e-5; also under grouped-query attention with Qwen3's
// q/k norms, and for several packed rows (the block-diagonal mask instead of the per-sequence loop).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>
#include <string>

#include "hybridflow/engine/model_log_probs.h"
#include "hybridflow/engine/packed_rows.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

using namespace hybridflow::testing;

constexpr int64_t kPrompt = 6, kResponse = 7;

// Rows of mixed lengths: prompts left padded by 0..3, responses right padded by 0..4.
struct MixedBatch {
  torch::Tensor ids, mask, response_mask;
};
MixedBatch mixed_batch() {
  torch::manual_seed(5);
  const int64_t rows = 5, len = kPrompt + kResponse;
  MixedBatch m;
  m.ids = torch::randint(0, 64, {rows, len}, torch::kLong);
  m.mask = torch::ones({rows, len}, torch::kLong);
  const int64_t left[] = {0, 3, 1, 2, 0}, right[] = {0, 4, 2, 0, 6};
  for (int64_t r = 0; r < rows; ++r) {
    m.mask[r].narrow(0, 0, left[r]).zero_();
    m.mask[r].narrow(0, len - right[r], right[r]).zero_();
  }
  m.response_mask = m.mask.narrow(1, kPrompt, kResponse).to(torch::kFloat);
  return m;
}

ModelConfig packing_config(bool qwen3) {
  ModelConfig c = tiny_model_config({.vocab_size = 64, .hidden_size = 32, .num_attention_heads = 4,
                                     .num_key_value_heads = 2, .max_position_embeddings = 128});
  c.attention_bias = true;
  if (qwen3) {
    c.architecture = "Qwen3ForCausalLM";
    c.model_type = "qwen3";
    c.explicit_head_dim = 12;
  }
  return c;
}

std::map<std::string, torch::Tensor> grads_of(CausalLMImpl& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model.named_parameters())
    out[item.key()] = item.value().grad().defined() ? item.value().grad().clone() : torch::zeros_like(item.value());
  return out;
}

void expect_close(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-5)) << what << " differ by " << (got - want).abs().max().item<double>();
}

void expect_same_grads(CausalLMImpl& got, CausalLMImpl& want, const std::string& what) {
  const auto g = grads_of(got), w = grads_of(want);
  double largest = 0;
  for (const auto& [name, tensor] : w) {
    largest = std::max(largest, tensor.abs().max().item<double>());
    EXPECT_TRUE(torch::allclose(g.at(name), tensor, 1e-5, 1e-5))
        << what << ": " << name << " differs by " << (g.at(name) - tensor).abs().max().item<double>();
  }
  EXPECT_GT(largest, 0.0) << what;
}

class PackedRowsTest : public ::testing::TestWithParam<bool> {};

TEST_P(PackedRowsTest, ResponseLogProbsEntropyAndGradientsEqualThePaddedPath) {
  const MixedBatch m = mixed_batch();
  CausalLM padded = seeded_model(packing_config(GetParam()), 17);
  CausalLM packed = seeded_model(packing_config(GetParam()), 17);
  auto want = response_log_probs(padded, m.ids, m.mask, kResponse);
  auto got = packed_response_log_probs(packed, m.ids, m.mask, kResponse);
  expect_close(got.log_probs * m.response_mask, want.log_probs * m.response_mask, "log-probs");
  expect_close(got.entropy * m.response_mask, want.entropy * m.response_mask, "entropy");
  torch::manual_seed(9);
  const auto weights = torch::randn({m.ids.size(0), kResponse}) * m.response_mask;
  ((want.log_probs - 0.1 * want.entropy) * weights).sum().backward();
  ((got.log_probs - 0.1 * got.entropy) * weights).sum().backward();
  expect_same_grads(*packed, *padded, "policy gradients");
}

TEST_P(PackedRowsTest, ValuesAndGradientsEqualThePaddedPath) {
  const MixedBatch m = mixed_batch();
  torch::manual_seed(23);
  CausalLM padded(packing_config(GetParam()), HeadKind::kValue);
  torch::manual_seed(23);
  CausalLM packed(packing_config(GetParam()), HeadKind::kValue);
  const auto real = m.mask.to(torch::kFloat);
  auto want = padded->forward(m.ids, m.mask).values * real;
  auto got = packed_values(packed, m.ids, m.mask);
  expect_close(got, want, "values");
  torch::manual_seed(4);
  const auto weights = torch::randn(want.sizes());
  (want * weights).sum().backward();
  (got * weights).sum().backward();
  expect_same_grads(*packed, *padded, "value gradients");
}

INSTANTIATE_TEST_SUITE_P(LlamaAndQwen3, PackedRowsTest, ::testing::Values(false, true));

TEST(PackedRows, PackLaysRealTokensEndToEndWithRestartingPositions) {
  auto ids = torch::tensor({{0, 5, 6, 7}, {8, 9, 0, 0}}, torch::kLong);
  auto mask = torch::tensor({{0, 1, 1, 1}, {1, 1, 0, 0}}, torch::kLong);
  const PackedRows rows = pack_rows(ids, mask);
  EXPECT_TRUE(torch::equal(rows.input_ids, torch::tensor({{5, 6, 7, 8, 9}}, torch::kLong)));
  EXPECT_TRUE(torch::equal(rows.attention_mask, torch::tensor({{1, 1, 1, 2, 2}}, torch::kLong)));
  EXPECT_TRUE(torch::equal(rows.position_ids, torch::tensor({{0, 1, 2, 0, 1}}, torch::kLong)));
  EXPECT_TRUE(torch::equal(rows.index, torch::tensor({{-1, 0, 1, 2}, {3, 4, -1, -1}}, torch::kLong)));
}

TEST(PackedRows, SeveralPackedRowsUseTheBlockDiagonalMask) {
  // Two packed rows of two sequences each against the four sequences run padded, one per row.
  CausalLM model = seeded_model(packing_config(false), 31);
  torch::manual_seed(2);
  auto ids = torch::randint(0, 64, {2, 7}, torch::kLong);
  auto packed_mask = torch::tensor({{1, 1, 1, 2, 2, 2, 2}, {1, 1, 1, 1, 1, 2, 2}}, torch::kLong);
  auto packed_hidden = model->hidden_states(ids, packed_mask);
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> pieces = {{0, 0, 3}, {0, 3, 4}, {1, 0, 5}, {1, 5, 2}};
  for (const auto& [row, start, length] : pieces) {
    auto alone = model->hidden_states(ids[row].narrow(0, start, length).unsqueeze(0), torch::ones({1, length}, torch::kLong));
    expect_close(packed_hidden[row].narrow(0, start, length).unsqueeze(0), alone,
                 "row " + std::to_string(row) + " from " + std::to_string(start));
  }
}

}  // namespace
}  // namespace hybridflow
