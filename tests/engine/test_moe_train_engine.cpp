// The load-balancing loss of a mixture-of-experts model joins the training loss in TrainEngine: each
// micro-batch's loss gains router_aux_loss_coef times the loss of its forward, weighted as the loss is, and
// the step reports the auxiliary loss itself.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "hybridflow/core/data_proto.h"
#include "hybridflow/engine/train_engine.h"
#include "hybridflow/model/transformer.h"

namespace hybridflow {
namespace {

ModelConfig tiny_qwen3_moe(double coef) {
  ModelConfig c;
  c.model_type = "qwen3_moe";
  c.architecture = causal_lm_architecture("qwen3_moe");
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.moe.num_experts = 4;
  c.moe.num_experts_per_tok = 2;
  c.moe.moe_intermediate_size = 8;
  c.moe.router_aux_loss_coef = coef;
  return c;
}

CausalLM random_model(double coef) {
  torch::manual_seed(21);
  CausalLM model(tiny_qwen3_moe(coef));
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters())
    if (!item.key().ends_with("norm.weight")) item.value().normal_(0.0, 0.25);
  return model;
}

DataProto batch() {
  torch::manual_seed(22);
  DataProto b;
  b.set_tensor("input_ids", torch::randint(0, 32, {4, 6}));
  auto mask = torch::ones({4, 6}, torch::kInt64);
  mask.index_put_({3, torch::indexing::Slice(0, 2)}, 0);
  b.set_tensor("attention_mask", mask);
  return b;
}

torch::Tensor lm_loss(CausalLM& model, const DataProto& micro) {
  return model->forward(micro.tensor("input_ids"), micro.tensor("attention_mask")).logits.pow(2).mean() * 0.01;
}

// An expert no token was routed to has no gradient at all.
torch::Tensor grad_or_zero(const torch::Tensor& p) { return p.grad().defined() ? p.grad().clone() : torch::zeros_like(p); }

OptimizerOptions no_update() {
  OptimizerOptions o;
  o.schedule.lr = 0.0;
  o.weight_decay = 0.0;
  o.grad_clip = 0.0;
  return o;
}

TEST(MoeTrainEngine, TheLoadBalancingLossJoinsEachMicroBatchsLoss) {
  const double coef = 0.3;
  CausalLM model = random_model(coef);
  const DataProto data = batch();
  // By hand: two micro-batches of 2 rows, each half of the mini-batch's rows.
  double expected_loss = 0, expected_aux = 0;
  model->zero_grad();
  for (int64_t begin : {0, 2}) {
    const DataProto micro = data.slice(begin, begin + 2);
    model->set_keep_router_logits(true);
    torch::Tensor loss = lm_loss(model, micro);
    torch::Tensor aux = model->load_balancing_loss();
    model->set_keep_router_logits(false);
    ((loss + coef * aux) * 0.5).backward();
    expected_loss += 0.5 * (loss + coef * aux).item<double>();
    expected_aux += 0.5 * aux.item<double>();
  }
  std::vector<torch::Tensor> expected_grads;
  for (const auto& p : model->parameters()) expected_grads.push_back(grad_or_zero(p));

  TrainEngine engine(model.ptr(), no_update());
  const StepStats stats = engine.train_step(data, 2, [&](const DataProto& micro) { return lm_loss(model, micro); });
  EXPECT_TRUE(stats.has_moe_aux_loss);
  EXPECT_NEAR(stats.moe_aux_loss, expected_aux, 1e-6);
  EXPECT_GT(stats.moe_aux_loss, 1.0);  // E x sum f_e P_e: 2 for a uniform router, top 2 of 4
  EXPECT_NEAR(stats.loss, expected_loss, 1e-6);
  size_t i = 0;
  for (const auto& p : model->parameters()) {
    EXPECT_TRUE(torch::allclose(grad_or_zero(p), expected_grads[i], 1e-5, 1e-7)) << "param " << i;
    ++i;
  }
  EXPECT_FALSE(model->keeps_router_logits());  // the engine leaves the model as it found it
}

TEST(MoeTrainEngine, NoCoefficientNoAuxiliaryLoss) {
  CausalLM model = random_model(0.0);
  const DataProto data = batch();
  TrainEngine engine(model.ptr(), no_update());
  const StepStats stats = engine.train_step(data, 2, [&](const DataProto& micro) { return lm_loss(model, micro); });
  EXPECT_FALSE(stats.has_moe_aux_loss);
  double loss = 0;
  for (int64_t begin : {0, 2}) loss += 0.5 * lm_loss(model, data.slice(begin, begin + 2)).item<double>();
  EXPECT_NEAR(stats.loss, loss, 1e-6);
}

}  // namespace
}  // namespace hybridflow
