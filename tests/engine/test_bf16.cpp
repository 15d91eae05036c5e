// bf16 mixed precision: a bf16 copy of a model gives log-probs and a training step close to fp32's
// (bounds below), trains against fp32 master weights with fp32 AdamW moments, and resumes exactly.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hybridflow/engine/model_log_probs.h"
#include "hybridflow/engine/train_engine.h"
#include "hybridflow/model/transformer.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

ModelConfig small_config() {
  return testing::tiny_model_config({.vocab_size = 48, .hidden_size = 64, .intermediate_size = 128});
}

// The same weights, the second copy cast to bf16.
std::pair<CausalLM, CausalLM> fp32_and_bf16_models(uint64_t seed) {
  torch::manual_seed(seed);
  CausalLM fp32(small_config());
  CausalLM bf16(small_config());
  {
    torch::NoGradGuard no_grad;
    auto src = fp32->parameters();
    auto dst = bf16->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
  bf16->to(torch::kBFloat16);
  return {fp32, bf16};
}

struct Batch {
  torch::Tensor ids, mask;
  int64_t response_len;
};

// Left-padded prompts of different lengths followed by responses: the layout RL workers score.
Batch rl_batch(uint64_t seed) {
  torch::manual_seed(seed);
  const int64_t rows = 4, prompt = 10, response = 12;
  auto ids = torch::randint(3, small_config().vocab_size, {rows, prompt + response}, torch::kLong);
  auto mask = torch::ones({rows, prompt + response}, torch::kLong);
  for (int64_t r = 0; r < rows; ++r) mask[r].slice(0, 0, 2 * r).zero_();  // 0, 2, 4, 6 pad tokens
  return {ids, mask, response};
}

TEST(Bf16, LogProbsStayWithinABoundOfFp32) {
  auto [fp32, bf16] = fp32_and_bf16_models(1);
  ASSERT_EQ(bf16->parameters().front().scalar_type(), torch::kBFloat16);
  auto b = rl_batch(2);
  torch::NoGradGuard no_grad;
  auto ref = response_log_probs(fp32, b.ids, b.mask, b.response_len);
  auto low = response_log_probs(bf16, b.ids, b.mask, b.response_len);
  // Losses and log-softmax stay fp32 whatever the parameters' dtype.
  EXPECT_EQ(low.log_probs.scalar_type(), torch::kFloat);
  EXPECT_EQ(low.entropy.scalar_type(), torch::kFloat);
  const double max_diff = (low.log_probs - ref.log_probs).abs().max().item<double>();
  const double mean_diff = (low.log_probs - ref.log_probs).abs().mean().item<double>();
  // Log-probs are about -log(48) = -3.9 here; bf16 keeps 8 bits of mantissa (relative error 4e-3).
  EXPECT_LT(max_diff, 0.05);
  EXPECT_LT(mean_diff, 0.01);
  EXPECT_GT(max_diff, 0.0) << "the bf16 model computed in fp32";
  EXPECT_LT((low.entropy - ref.entropy).abs().max().item<double>(), 0.05);
}

// Mean negative log-likelihood of the response tokens: a loss that reaches every parameter.
MicroLossFn nll_loss(CausalLM model, int64_t response_len) {
  return [model, response_len](const DataProto& m) mutable {
    auto lp = response_log_probs(model, m.tensor("input_ids"), m.tensor("attention_mask"), response_len);
    return -lp.log_probs.mean();
  };
}

DataProto as_data(const Batch& b) {
  DataProto d;
  d.set_tensor("input_ids", b.ids);
  d.set_tensor("attention_mask", b.mask);
  return d;
}

OptimizerOptions adamw(double lr) {
  OptimizerOptions o;
  o.schedule.lr = lr;
  return o;
}

// The optimizer's parameters (decay group, then no-decay group) put back in the module's order.
std::vector<torch::Tensor> masters_in_module_order(TrainEngine& engine, torch::nn::Module& module) {
  auto& groups = engine.optimizer().param_groups();
  size_t decay = 0, no_decay = 0;
  std::vector<torch::Tensor> out;
  for (const auto& item : module.named_parameters()) {
    if (excluded_from_weight_decay(item.key(), item.value()))
      out.push_back(groups[1].params()[no_decay++]);
    else
      out.push_back(groups[0].params()[decay++]);
  }
  return out;
}

TEST(Bf16, ATrainingStepStaysCloseToFp32WithFp32MastersAndMoments) {
  auto [fp32, bf16] = fp32_and_bf16_models(3);
  auto b = rl_batch(4);
  const auto before = fp32->parameters();
  std::vector<torch::Tensor> initial;
  for (const auto& p : before) initial.push_back(p.detach().clone());
  TrainEngine e32(fp32.ptr(), adamw(1e-3));
  TrainEngine e16(bf16.ptr(), adamw(1e-3));
  EXPECT_FALSE(e32.mixed_precision());
  ASSERT_TRUE(e16.mixed_precision());
  auto s32 = e32.train_step(as_data(b), 2, nll_loss(fp32, b.response_len), "", LossWeighting::kRowMean);
  auto s16 = e16.train_step(as_data(b), 2, nll_loss(bf16, b.response_len), "", LossWeighting::kRowMean);
  EXPECT_NEAR(s16.loss, s32.loss, 0.01 * std::abs(s32.loss));
  EXPECT_NEAR(s16.grad_norm, s32.grad_norm, 0.05 * s32.grad_norm);

  // AdamW's state lives on fp32 masters, not on the bf16 parameters.
  for (const auto& group : e16.optimizer().param_groups())
    for (const auto& p : group.params()) EXPECT_EQ(p.scalar_type(), torch::kFloat);
  for (const auto& [key, state] : e16.optimizer().state()) {
    auto& adam = static_cast<torch::optim::AdamWParamState&>(*state);
    EXPECT_EQ(adam.exp_avg().scalar_type(), torch::kFloat);
    EXPECT_EQ(adam.exp_avg_sq().scalar_type(), torch::kFloat);
  }

  // The update itself: bf16's step moves the weights like fp32's. The first AdamW step moves each weight
  // by about lr, so compare the moves, measured on the masters (the bf16 weights are their rounding).
  const auto masters = masters_in_module_order(e16, *bf16);
  const auto after32 = fp32->parameters();
  const auto after16 = bf16->parameters();
  ASSERT_EQ(masters.size(), after32.size());
  double move_diff = 0, move = 0;
  for (size_t i = 0; i < after32.size(); ++i) {
    EXPECT_TRUE(torch::equal(masters[i].detach().to(torch::kBFloat16), after16[i].detach()))
        << "parameter " << i << " is not the bf16 rounding of its master";
    const auto d32 = after32[i].detach() - initial[i];
    move_diff += ((masters[i].detach() - initial[i]) - d32).abs().sum().item<double>();
    move += d32.abs().sum().item<double>();
  }
  ASSERT_GT(move, 0);
  // Where bf16 and fp32 gradients disagree in sign the first AdamW moves differ by 2 lr; allow 10% of it.
  EXPECT_LT(move_diff / move, 0.1);
}

// Two more steps of the saved engine and of the one that loaded its state give the same losses and
// weights, bit for bit.
template <typename Model, typename Batch>
void expect_same_next_steps(Model& a, TrainEngine& ea, Model& c, TrainEngine& ec, const Batch& b) {
  for (int i = 0; i < 2; ++i) {
    auto sa = ea.train_step(as_data(b), 4, nll_loss(a, b.response_len), "", LossWeighting::kRowMean);
    auto sc = ec.train_step(as_data(b), 4, nll_loss(c, b.response_len), "", LossWeighting::kRowMean);
    EXPECT_EQ(sa.loss, sc.loss);
  }
  for (size_t i = 0; i < a->parameters().size(); ++i)
    EXPECT_TRUE(torch::equal(a->parameters()[i], c->parameters()[i])) << "param " << i;
}

TEST(Bf16, SavedStateResumesFromTheFp32Masters) {
  testing::TempDir dir;
  auto [unused, a] = fp32_and_bf16_models(5);
  auto b = rl_batch(6);
  TrainEngine ea(a.ptr(), adamw(1e-3));
  for (int i = 0; i < 2; ++i) ea.train_step(as_data(b), 4, nll_loss(a, b.response_len), "", LossWeighting::kRowMean);
  ea.save_state(dir.file("optim.pt"));

  // Another bf16 model, deliberately with other weights: the state must bring back the masters, which the
  // module's bf16 weights alone cannot (their rounding loses the low bits the next steps build on).
  auto [unused2, c] = fp32_and_bf16_models(7);
  TrainEngine ec(c.ptr(), adamw(1e-3));
  ec.load_state(dir.file("optim.pt"));
  expect_same_next_steps(a, ea, c, ec, b);
}

// The layout-free form checkpoints use (TrainEngine::named_state): the same resumption, from tensors by
// parameter name.
TEST(Bf16, NamedStateResumesFromTheFp32Masters) {
  auto [unused, a] = fp32_and_bf16_models(5);
  auto b = rl_batch(6);
  TrainEngine ea(a.ptr(), adamw(1e-3));
  for (int i = 0; i < 2; ++i) ea.train_step(as_data(b), 4, nll_loss(a, b.response_len), "", LossWeighting::kRowMean);
  const TrainEngine::NamedState state = ea.named_state();
  EXPECT_EQ(state.step, 2);
  ASSERT_EQ(state.parameters.size(), a->named_parameters().size());
  for (const auto& [name, p] : state.parameters) {
    EXPECT_EQ(p.adam_step, 2) << name;
    ASSERT_TRUE(p.master.defined()) << name;
    EXPECT_EQ(p.master.scalar_type(), torch::kFloat) << name;
  }

  auto [unused2, c] = fp32_and_bf16_models(7);
  TrainEngine ec(c.ptr(), adamw(1e-3));
  ec.load_named_state(state);
  EXPECT_EQ(ec.step(), 2);
  expect_same_next_steps(a, ea, c, ec, b);

  // A tensor of the wrong shape is refused naming the parameter.
  TrainEngine::NamedState bad = state;
  auto& first = bad.parameters.begin()->second;
  first.exp_avg = torch::zeros({3});
  const std::string e = testing::error_of([&] { ec.load_named_state(bad); });
  EXPECT_NE(e.find(bad.parameters.begin()->first), std::string::npos) << e;
  EXPECT_NE(e.find("exp_avg"), std::string::npos) << e;
}

}  // namespace
}  // namespace hybridflow
