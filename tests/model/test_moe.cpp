// Mixture-of-experts routing, the load-balancing loss, router replay and the parameter counts of MoE configs.
// (tests/engine/test_moe_oracle.cpp compares the models with transformers.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "hybridflow/model/model_size.h"
#include "hybridflow/model/moe.h"
#include "hybridflow/model/transformer.h"
#include "model/moe_block.h"
#include "support/error_of.h"

namespace hybridflow {
namespace {

using ::testing::HasSubstr;
using hybridflow::testing::error_of;

ModelConfig tiny_moe(const std::string& type, int64_t top_k = 2) {
  ModelConfig c;
  c.model_type = type;
  c.architecture = causal_lm_architecture(type);
  c.vocab_size = 40;
  c.hidden_size = 24;
  c.intermediate_size = type == "mixtral" ? 10 : 30;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.moe.num_experts = 5;
  c.moe.num_experts_per_tok = top_k;
  c.moe.moe_intermediate_size = 8;
  c.moe.norm_topk_prob = true;
  if (type == "qwen2_moe") c.moe.shared_expert_intermediate_size = 12;
  if (type == "qwen2_moe") c.attention_bias = true;
  return c;
}

// Router weights large enough that routing depends on the input (HF's init leaves them near uniform).
CausalLM random_model(const ModelConfig& c, uint64_t seed) {
  torch::manual_seed(seed);
  CausalLM model(c);
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters())
    if (!item.key().ends_with("norm.weight")) item.value().normal_(0.0, 1.0 / std::sqrt(24.0));
  return model;
}

TEST(MoeRouting, TopKIsTheSoftmaxOverAllExpertsThenTheLargestK) {
  const auto logits = torch::tensor({{1.0, 3.0, 2.0, 0.0}, {0.5, -1.0, 0.25, 4.0}});
  const auto probs = torch::softmax(logits, -1);
  auto plain = route_top_k(logits, 2, /*normalise=*/false);
  EXPECT_TRUE(torch::equal(plain.experts, torch::tensor({{1, 2}, {3, 0}}, torch::kInt64)));
  EXPECT_TRUE(torch::allclose(plain.weights, torch::stack({probs.index({0, torch::tensor({1, 2})}),
                                                           probs.index({1, torch::tensor({3, 0})})})));
  // Renormalised, two experts' weights are the logistic function of their logits' difference.
  auto normalised = route_top_k(logits, 2, /*normalise=*/true);
  EXPECT_NEAR(normalised.weights[0][0].item<double>(), 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(normalised.weights[1][1].item<double>(), 1.0 / (1.0 + std::exp(3.5)), 1e-6);
  // Replaying the same experts gives the same weights, bit for bit.
  auto replayed = route_replayed(logits, normalised.experts, true);
  EXPECT_TRUE(torch::equal(replayed.weights, normalised.weights));
  // Other experts: their probabilities, renormalised.
  auto other = route_replayed(logits, torch::tensor({{0, 3}, {1, 2}}, torch::kInt64), true);
  EXPECT_NEAR(other.weights[0][0].item<double>(), 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
  EXPECT_THAT(error_of([&] { route_replayed(logits, torch::tensor({{0, 9}, {1, 2}}, torch::kInt64), true); }),
              HasSubstr("must be in [0, 4)"));
}

TEST(MoeRouting, ExpertsRunOnTheirTokensAndSumWeighted) {
  torch::manual_seed(3);
  std::vector<moe::Expert> experts;
  for (int e = 0; e < 4; ++e) experts.push_back(moe::Expert(6, 5, "gate_proj", "up_proj", "down_proj"));
  const auto x = torch::randn({9, 6});
  const auto routing = route_top_k(torch::randn({9, 4}), 2, false);
  const auto out = moe::run_experts(x, routing, experts, /*float_weights=*/true);
  // Token by token, with no gathering.
  for (int64_t t = 0; t < 9; ++t) {
    auto expected = torch::zeros({6});
    for (int64_t j = 0; j < 2; ++j) {
      const int64_t e = routing.experts[t][j].item<int64_t>();
      expected += routing.weights[t][j] * experts[static_cast<size_t>(e)]->forward(x[t].unsqueeze(0)).squeeze(0);
    }
    EXPECT_TRUE(torch::allclose(out[t], expected, 1e-5, 1e-6)) << "token " << t;
  }
}

// The grouped-GEMM form of the experts (the CUDA path; libtorch's reference implementation on the CPU) gives
// each expert's own forward on its group of rows, an empty group and a subset of the experts included, and
// the same gradients for the rows and every expert weight.
TEST(MoeRouting, GroupedGemmFormEqualsEachExpertOnItsRows) {
  torch::manual_seed(4);
  std::vector<moe::Expert> experts;
  for (int e = 0; e < 5; ++e) experts.push_back(moe::Expert(8, 16, "gate_proj", "up_proj", "down_proj"));
  const std::vector<int64_t> sizes = {3, 0, 6, 2};  // experts 1..4 (expert 2 gets no row, expert 0 is left out)
  const auto rows = torch::randn({11, 8}, torch::requires_grad());
  const auto grad_out = torch::randn({11, 8});
  // The gradients of the rows and of every expert weight (zeros where none flowed), cleared after reading.
  auto take_grads = [&] {
    std::vector<torch::Tensor> grads = {rows.grad().clone()};
    rows.mutable_grad() = torch::Tensor();
    for (auto& expert : experts)
      for (auto& p : expert->parameters()) {
        grads.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
        p.mutable_grad() = torch::Tensor();
      }
    return grads;
  };
  const auto grouped = moe::expert_groups_grouped_gemm(rows, experts, 1, sizes);
  (grouped * grad_out).sum().backward();
  const auto grouped_grads = take_grads();
  std::vector<torch::Tensor> parts;
  int64_t offset = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    parts.push_back(experts[1 + i]->forward(rows.narrow(0, offset, sizes[i])));
    offset += sizes[i];
  }
  const auto looped = torch::cat(parts);
  (looped * grad_out).sum().backward();
  const auto looped_grads = take_grads();
  EXPECT_TRUE(torch::allclose(grouped, looped, 1e-5, 1e-6)) << (grouped - looped).abs().max().item<double>();
  ASSERT_EQ(grouped_grads.size(), looped_grads.size());
  for (size_t i = 0; i < looped_grads.size(); ++i)
    EXPECT_TRUE(torch::allclose(grouped_grads[i], looped_grads[i], 1e-5, 1e-6)) << "gradient " << i;
  EXPECT_GT(looped_grads[1 + 3 * 3].abs().max().item<double>(), 0) << "expert 3 trained";
}

// transformers' load_balancing_loss_func written out token by token: E x sum_e f_e P_e, f_e the share of
// top-k assignments to e and P_e its mean probability, over every layer's real tokens together.
TEST(MoeRouting, LoadBalancingLossIsTheSwitchTransformerLoss) {
  torch::manual_seed(5);
  const int64_t experts = 4, k = 2;
  std::vector<torch::Tensor> logits = {torch::randn({6, experts}), torch::randn({6, experts})};
  const auto mask = torch::tensor({{0, 1, 1}, {1, 1, 1}}, torch::kInt64);
  double assigned[4] = {}, probability[4] = {}, rows = 0;
  for (const auto& layer : logits) {
    const auto probs = torch::softmax(layer, -1);
    for (int64_t t = 0; t < 6; ++t) {
      if (mask.reshape({-1})[t].item<int64_t>() == 0) continue;
      rows += 1;
      const auto top = std::get<1>(probs[t].topk(k));
      for (int64_t j = 0; j < k; ++j) assigned[top[j].item<int64_t>()] += 1;
      for (int64_t e = 0; e < experts; ++e) probability[e] += probs[t][e].item<double>();
    }
  }
  double expected = 0;
  for (int64_t e = 0; e < experts; ++e) expected += (assigned[e] / rows) * (probability[e] / rows);
  expected *= experts;
  EXPECT_NEAR(load_balancing_loss(logits, experts, k, mask).item<double>(), expected, 1e-6);
  // Without a mask every token counts; a uniform router gives exactly k.
  EXPECT_NEAR(load_balancing_loss({torch::zeros({5, experts})}, experts, k).item<double>(), static_cast<double>(k), 1e-6);
}

TEST(MoeConfig, SparseLayersFollowDecoderSparseStepAndMlpOnlyLayers) {
  ModelConfig c = tiny_moe("qwen3_moe");
  c.num_hidden_layers = 6;
  c.moe.decoder_sparse_step = 2;
  c.moe.mlp_only_layers = {3, 2};
  std::vector<bool> sparse;
  for (int64_t i = 0; i < 6; ++i) sparse.push_back(c.moe_layer(i));
  EXPECT_EQ(sparse, (std::vector<bool>{false, true, false, false, false, true}));
  EXPECT_EQ(c.num_moe_layers(), 2);
  c.moe.num_experts = 0;  // transformers: no experts, every layer dense
  EXPECT_EQ(c.num_moe_layers(), 0);
  // Mixtral has neither key: every layer is sparse.
  ModelConfig m = tiny_moe("mixtral");
  m.moe.decoder_sparse_step = 2;
  EXPECT_EQ(m.num_moe_layers(), 3);
  // An absurd layer count is counted without visiting every layer (validate() must not hang on it).
  c.moe.num_experts = 5;
  c.num_hidden_layers = int64_t{1} << 50;
  EXPECT_EQ(c.num_moe_layers(), (int64_t{1} << 49) - 1);
}

TEST(MoeConfig, InvalidSettingsNameTheirKeys) {
  ModelConfig c = tiny_moe("qwen2_moe");
  c.moe.num_experts_per_tok = 6;
  EXPECT_THAT(error_of([&] { c.validate(); }), HasSubstr("num_experts_per_tok must be in [1, num_experts = 5]"));
  c = tiny_moe("mixtral");
  c.intermediate_size = 0;
  EXPECT_THAT(error_of([&] { c.validate(); }), HasSubstr("intermediate_size must be > 0"));
  c = tiny_moe("qwen3_moe");
  c.moe.mlp_only_layers = {7};
  EXPECT_THAT(error_of([&] { c.validate(); }), HasSubstr("mlp_only_layers lists layer 7"));
  c = tiny_moe("qwen2_moe");
  c.moe.shared_expert_intermediate_size = 0;
  EXPECT_THAT(error_of([&] { c.validate(); }), HasSubstr("shared_expert_intermediate_size must be > 0"));
}

// Every weight the config implies is what the model builds, and the counts of model_size.h are its numels:
// all experts in the total, num_experts_per_tok of them in the active count.
TEST(MoeConfig, WeightsAndParameterCountsMatchTheBuiltModel) {
  for (const char* type : {"qwen2_moe", "qwen3_moe", "mixtral"}) {
    SCOPED_TRACE(type);
    ModelConfig c = tiny_moe(type);
    if (std::string(type) == "qwen2_moe") c.moe.mlp_only_layers = {1};
    CausalLM model(c);
    std::map<std::string, std::vector<int64_t>> built;
    double total = 0, one_expert = 0;
    for (const auto& item : model->named_parameters()) {
      built[item.key()] = item.value().sizes().vec();
      total += static_cast<double>(item.value().numel());
      if (item.key().find(".experts.0.") != std::string::npos && item.key().starts_with("model.layers.0."))
        one_expert += static_cast<double>(item.value().numel());
    }
    EXPECT_EQ(built, expected_weight_shapes(c));
    EXPECT_EQ(static_cast<double>(built.size()), expected_weight_count(c));
    const ModelSize size = model_size(c);
    EXPECT_DOUBLE_EQ(size.parameters(), total);
    EXPECT_EQ(c.num_parameters(), static_cast<int64_t>(total));
    const double sparse = static_cast<double>(c.num_moe_layers());
    EXPECT_DOUBLE_EQ(size.active_parameters(), total - sparse * (5 - 2) * one_expert);
  }
  EXPECT_THAT(error_of([] {
                TensorParallelGroup tp;
                ModelConfig c = tiny_moe("qwen3_moe");
                CausalLM model(c, HeadKind::kLanguageModel, tp);
                LoraConfig lora;
                lora.rank = 4;
                model->add_lora(lora);
              }),
              HasSubstr("all-linear on a mixture-of-experts model would adapt its experts"));
}

struct ReplayInputs {
  torch::Tensor ids = torch::randint(3, 40, {3, 9});
  torch::Tensor mask = torch::ones({3, 9}, torch::kInt64);
  ReplayInputs() { mask.index_put_({2, torch::indexing::Slice(0, 4)}, 0); }  // a left-padded row
};

TEST(RouterReplay, ReplayingTheRecordedRoutingReproducesTheLogitsBitForBit) {
  for (const char* type : {"qwen2_moe", "qwen3_moe", "mixtral"}) {
    SCOPED_TRACE(type);
    CausalLM model = random_model(tiny_moe(type, 3), 7);
    torch::manual_seed(8);
    ReplayInputs in;
    torch::NoGradGuard no_grad;
    model->set_router_replay(RouterReplayMode::kRecord);
    const auto logits = model->forward(in.ids, in.mask).logits;
    const ExpertRouting recorded = model->recorded_routing();
    ASSERT_EQ(static_cast<int64_t>(recorded.layers.size()), model->config().num_moe_layers());
    EXPECT_EQ(recorded.layers[0].sizes(), (std::vector<int64_t>{3, 9, 3}));
    model->set_router_replay(RouterReplayMode::kReplay, recorded);
    EXPECT_TRUE(torch::equal(model->forward(in.ids, in.mask).logits, logits));
    EXPECT_FALSE(model->replay_differs().any().item<bool>());
    model->set_router_replay(RouterReplayMode::kOff);
    EXPECT_TRUE(torch::equal(model->forward(in.ids, in.mask).logits, logits));
  }
}

// After an update of the routers, replaying the old routing changes nothing in a row before its first token
// whose routing differs (up to rounding: an expert's matmul runs over another set of tokens) and changes that
// token's logits; replay_differs() marks that token and none before it. (After it the hidden states differ, so
// the current router's choice there is its choice on other inputs.)
TEST(RouterReplay, APerturbedRouterDiffersExactlyWhereRoutingDiffers) {
  CausalLM model = random_model(tiny_moe("qwen3_moe", 2), 9);
  torch::manual_seed(10);
  ReplayInputs in;
  torch::NoGradGuard no_grad;
  model->set_router_replay(RouterReplayMode::kRecord);
  model->forward(in.ids, in.mask);
  const ExpertRouting before = model->recorded_routing();
  for (auto& item : model->named_parameters())
    if (item.key().ends_with("mlp.gate.weight")) item.value().add_(0.02 * torch::randn(item.value().sizes()));
  const auto own_logits = model->forward(in.ids, in.mask).logits;
  const ExpertRouting after = model->recorded_routing();
  const auto differs = routing_differs(before, after).logical_and(in.mask.to(torch::kBool));
  const int64_t changed = differs.sum().item<int64_t>();
  std::printf("real tokens whose routing the perturbation changed: %lld of %lld\n", static_cast<long long>(changed),
              static_cast<long long>(in.mask.sum().item<int64_t>()));
  ASSERT_GT(changed, 0);

  model->set_router_replay(RouterReplayMode::kReplay, before);
  const auto replayed_logits = model->forward(in.ids, in.mask).logits;
  const auto replay_differs = model->replay_differs().logical_and(in.mask.to(torch::kBool));
  std::printf("real tokens the replay marks as routed otherwise by the current router: %lld\n",
              static_cast<long long>(replay_differs.sum().item<int64_t>()));
  int64_t compared_prefix = 0, rows_with_change = 0;
  for (int64_t r = 0; r < 3; ++r) {
    auto changed_at = differs[r].nonzero();
    const int64_t first = changed_at.numel() > 0 ? changed_at[0][0].item<int64_t>() : 9;
    for (int64_t p = 0; p < first; ++p) {
      if (in.mask[r][p].item<int64_t>() == 0) continue;
      ++compared_prefix;
      EXPECT_LE((replayed_logits[r][p] - own_logits[r][p]).abs().max().item<double>(), 1e-5) << r << ", " << p;
      EXPECT_FALSE(replay_differs[r][p].item<bool>()) << r << ", " << p;
    }
    if (first == 9) continue;
    ++rows_with_change;
    EXPECT_GT((replayed_logits[r][first] - own_logits[r][first]).abs().max().item<double>(), 1e-3) << r << ", " << first;
    EXPECT_TRUE(replay_differs[r][first].item<bool>()) << r << ", " << first;
  }
  EXPECT_GT(compared_prefix, 0);
  EXPECT_GT(rows_with_change, 0);
}

// -1 marks a token without a recorded routing (padding, a generated sequence's last token): it keeps the
// router's own choice, so a replay of nothing but -1 is no replay at all, and a partly recorded replay
// changes only what its recorded tokens say.
TEST(RouterReplay, UnrecordedTokensKeepTheRoutersOwnChoice) {
  const auto logits = torch::tensor({{1.0, 3.0, 2.0, 0.0}, {0.5, -1.0, 0.25, 4.0}});
  const auto own = route_top_k(logits, 2, true);
  const auto none = route_replayed(logits, torch::full({2, 2}, -1, torch::kInt64), true);
  EXPECT_TRUE(torch::equal(none.experts, own.experts));
  EXPECT_TRUE(torch::equal(none.weights, own.weights));
  const auto partly = route_replayed(logits, torch::tensor({{-1, -1}, {1, 2}}, torch::kInt64), true);
  EXPECT_TRUE(torch::equal(partly.experts, torch::tensor({{1, 2}, {1, 2}}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(partly.weights[0], own.weights[0]));
  EXPECT_THAT(error_of([&] { route_replayed(logits, torch::tensor({{-2, 1}, {1, 2}}, torch::kInt64), true); }),
              HasSubstr("or -1: not recorded"));

  CausalLM model = random_model(tiny_moe("qwen2_moe", 2), 15);
  torch::manual_seed(16);
  ReplayInputs in;
  torch::NoGradGuard no_grad;
  const auto plain = model->forward(in.ids, in.mask).logits;
  ExpertRouting unrecorded;
  for (int64_t l = 0; l < model->config().num_moe_layers(); ++l)
    unrecorded.layers.push_back(torch::full({3, 9, 2}, -1, torch::kInt64));
  model->set_router_replay(RouterReplayMode::kReplay, unrecorded);
  EXPECT_TRUE(torch::equal(model->forward(in.ids, in.mask).logits, plain));
  EXPECT_FALSE(model->replay_differs().any().item<bool>());
}

TEST(RouterReplay, ReplayUnderActivationCheckpointingGivesTheSameLossAndGradients) {
  CausalLM model = random_model(tiny_moe("qwen2_moe", 2), 11);
  torch::manual_seed(12);
  ReplayInputs in;
  {
    torch::NoGradGuard no_grad;
    model->set_router_replay(RouterReplayMode::kRecord);
    model->forward(in.ids, in.mask);
  }
  const ExpertRouting recorded = model->recorded_routing();
  model->set_router_replay(RouterReplayMode::kReplay, recorded);
  auto run = [&](bool checkpointing) {
    model->set_gradient_checkpointing(checkpointing);
    model->zero_grad();
    model->forward(in.ids, in.mask).logits.pow(2).mean().backward();
    std::vector<torch::Tensor> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  const auto plain = run(false), checkpointed = run(true);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::allclose(plain[i], checkpointed[i], 1e-5, 1e-7)) << i;
}

// The load-balancing loss reaches the routers' weights, with and without activation checkpointing.
TEST(LoadBalancingLoss, TrainsTheRouters) {
  CausalLM model = random_model(tiny_moe("mixtral", 2), 13);
  torch::manual_seed(14);
  ReplayInputs in;
  for (bool checkpointing : {false, true}) {
    model->set_gradient_checkpointing(checkpointing);
    model->set_keep_router_logits(true);
    model->zero_grad();
    model->forward(in.ids, in.mask);
    model->load_balancing_loss().backward();
    int64_t routers = 0;
    for (const auto& item : model->named_parameters())
      if (item.key().ends_with("block_sparse_moe.gate.weight")) {
        ++routers;
        EXPECT_GT(item.value().grad().abs().sum().item<double>(), 0) << item.key();
      }
    EXPECT_EQ(routers, 3);
  }
  model->set_keep_router_logits(false);
  EXPECT_THAT(error_of([&] { model->load_balancing_loss(); }), HasSubstr("no router logits kept"));
}

}  // namespace
}  // namespace hybridflow
