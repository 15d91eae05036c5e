#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "hybridflow/core/error.h"
#include "hybridflow/engine/lr_schedule.h"
#include "hybridflow/engine/train_engine.h"
#include "support/temp_dir.h"

namespace hybridflow {
namespace {

// A tiny "token model": per-token features -> linear -> norm-like scale -> 1 output per token.
struct ToyImpl : torch::nn::Module {
  ToyImpl() {
    proj = register_module("proj", torch::nn::Linear(4, 3));
    out = register_module("out", torch::nn::Linear(3, 1));
    norm_weight = register_parameter("norm_weight", torch::ones({3}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return out(torch::tanh(proj(x)) * norm_weight).squeeze(-1); }
  torch::nn::Linear proj{nullptr}, out{nullptr};
  torch::Tensor norm_weight;
};
TORCH_MODULE(Toy);

// Masked mean squared error over the tokens of a micro-batch.
MicroLossFn mse_loss(Toy model) {
  return [model](const DataProto& b) mutable {
    auto err = (model->forward(b.tensor("x")) - b.tensor("y")).pow(2);
    auto mask = b.tensor("loss_mask").to(torch::kFloat);
    return (err * mask).sum() / mask.sum();
  };
}

DataProto toy_batch(int64_t rows, int64_t tokens, uint64_t seed) {
  torch::manual_seed(seed);
  DataProto batch;
  auto x = torch::randn({rows, tokens, 4});
  batch.set_tensor("x", x);
  batch.set_tensor("y", x.sum(-1).sin());
  // Ragged lengths so micro-batches hold different token counts.
  auto lengths = torch::randint(1, tokens + 1, {rows, 1}, torch::kLong);
  batch.set_tensor("loss_mask", (torch::arange(tokens).unsqueeze(0) < lengths).to(torch::kLong));
  return batch;
}

OptimizerOptions plain_sgd_like(double lr) {
  OptimizerOptions o;
  o.schedule.lr = lr;
  o.weight_decay = 0.0;
  o.grad_clip = 0.0;
  return o;
}

std::vector<torch::Tensor> grads_of(torch::nn::Module& m) {
  std::vector<torch::Tensor> g;
  for (auto& p : m.parameters()) g.push_back(p.grad().clone());
  return g;
}

TEST(TrainEngine, MicroBatchAccumulationEqualsFullBatchGradient) {
  auto batch = toy_batch(7, 5, 3);
  torch::manual_seed(11);
  Toy a;
  Toy b;
  {
    torch::NoGradGuard ng;
    for (size_t i = 0; i < a->parameters().size(); ++i) b->parameters()[i].copy_(a->parameters()[i]);
  }
  TrainEngine full(a.ptr(), plain_sgd_like(0.0));  // lr 0: parameters stay put, gradients remain to compare
  TrainEngine micro(b.ptr(), plain_sgd_like(0.0));
  auto s_full = full.train_step(batch, 7, mse_loss(a));
  auto s_micro = micro.train_step(batch, 2, mse_loss(b));
  EXPECT_EQ(s_full.micro_batches, 1);
  EXPECT_EQ(s_micro.micro_batches, 4);
  EXPECT_EQ(s_full.tokens, batch.tensor("loss_mask").sum().item<int64_t>());
  EXPECT_NEAR(s_full.loss, s_micro.loss, 1e-5);
  EXPECT_NEAR(s_full.grad_norm, s_micro.grad_norm, 1e-5);
  auto ga = grads_of(*a), gb = grads_of(*b);
  for (size_t i = 0; i < ga.size(); ++i) EXPECT_TRUE(torch::allclose(ga[i], gb[i], 1e-5, 1e-6)) << "param " << i;
}

TEST(TrainEngine, ClippingCapsTheGlobalNormAndReportsThePreClipNorm) {
  Toy model;
  OptimizerOptions o = plain_sgd_like(0.0);
  o.grad_clip = 0.01;
  TrainEngine engine(model.ptr(), o);
  auto batch = toy_batch(4, 3, 5);
  auto stats = engine.train_step(batch, 4, mse_loss(model));
  ASSERT_GT(stats.grad_norm, 0.01);
  double sq = 0;
  for (auto& p : model->parameters()) sq += p.grad().pow(2).sum().item<double>();
  EXPECT_NEAR(std::sqrt(sq), 0.01, 1e-4);
}

TEST(LrSchedule, WarmupThenDecayFollowsTheFormula) {
  LrSchedule s;
  s.lr = 2.0;
  s.warmup_steps = 4;
  s.total_steps = 14;
  s.min_lr_ratio = 0.1;
  s.kind = "constant";
  EXPECT_DOUBLE_EQ(lr_at_step(s, 0), 0.5);
  EXPECT_DOUBLE_EQ(lr_at_step(s, 3), 2.0);
  EXPECT_DOUBLE_EQ(lr_at_step(s, 100), 2.0);
  s.kind = "linear";
  EXPECT_DOUBLE_EQ(lr_at_step(s, 1), 1.0);
  EXPECT_DOUBLE_EQ(lr_at_step(s, 4), 2.0);
  EXPECT_NEAR(lr_at_step(s, 9), 2.0 * (0.1 + 0.9 * 0.5), 1e-12);  // halfway through the decay
  EXPECT_NEAR(lr_at_step(s, 14), 0.2, 1e-12);
  EXPECT_NEAR(lr_at_step(s, 50), 0.2, 1e-12);
  s.kind = "cosine";
  EXPECT_NEAR(lr_at_step(s, 4), 2.0, 1e-12);
  EXPECT_NEAR(lr_at_step(s, 9), 2.0 * (0.1 + 0.9 * 0.5), 1e-12);
  EXPECT_NEAR(lr_at_step(s, 6), 2.0 * (0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.2))), 1e-12);
  EXPECT_NEAR(lr_at_step(s, 14), 0.2, 1e-12);
  s.kind = "exponential";
  EXPECT_THROW(lr_at_step(s, 0), Error);
  s.kind = "cosine";
  s.total_steps = 0;
  EXPECT_THROW(lr_at_step(s, 5), Error);
}

// verl's schedulers (and transformers') compute lr x k / warmup at step k: the first step's rate is 0.
TEST(LrSchedule, VerlWarmupStartsFromZero) {
  LrSchedule s;
  s.lr = 2.0;
  s.warmup_steps = 4;
  s.warmup_from_zero = true;
  s.total_steps = 14;
  s.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(lr_at_step(s, 0), 0.0);
  EXPECT_DOUBLE_EQ(lr_at_step(s, 1), 0.5);
  EXPECT_DOUBLE_EQ(lr_at_step(s, 3), 1.5);
  EXPECT_DOUBLE_EQ(lr_at_step(s, 4), 2.0);
  s.kind = "cosine";  // after warm-up the decay is the same: halfway (step 9 of 4..14) is 0.1 + 0.9 x 0.5
  EXPECT_DOUBLE_EQ(lr_at_step(s, 2), 1.0);
  EXPECT_NEAR(lr_at_step(s, 9), 2.0 * 0.55, 1e-12);
}

// verl's num_cycles: the cosine runs 2 pi x num_cycles x progress, so 1 cycle falls to the floor halfway and is
// back at lr at total_steps; the default 0.5 is the half cosine above.
TEST(LrSchedule, CosineCyclesFollowVerlsFormula) {
  LrSchedule s;
  s.lr = 2.0;
  s.kind = "cosine";
  s.warmup_steps = 0;
  s.total_steps = 8;
  s.min_lr_ratio = 0.25;
  s.num_cycles = 1.0;
  EXPECT_NEAR(lr_at_step(s, 0), 2.0, 1e-12);
  EXPECT_NEAR(lr_at_step(s, 2), 2.0 * (0.25 + 0.75 * 0.5), 1e-12);  // a quarter: cos(pi / 2) = 0
  EXPECT_NEAR(lr_at_step(s, 4), 0.5, 1e-12);                          // the floor, halfway
  EXPECT_NEAR(lr_at_step(s, 6), 2.0 * (0.25 + 0.75 * 0.5), 1e-12);
  EXPECT_NEAR(lr_at_step(s, 8), 2.0, 1e-12);
  s.num_cycles = 0.5;
  EXPECT_NEAR(lr_at_step(s, 4), 2.0 * (0.25 + 0.75 * 0.5), 1e-12);
  EXPECT_NEAR(lr_at_step(s, 8), 0.5, 1e-12);
  s.num_cycles = 0;
  EXPECT_THROW(lr_at_step(s, 1), Error);
}

// AdamW's betas reach the optimizer: with (0, 0) it keeps no memory of earlier gradients, so its second step
// (bias correction is 1) moves every parameter by exactly lr x the sign of that step's gradient; the default
// betas average the two steps' gradients and do not.
TEST(TrainEngine, AdamBetasReachTheOptimizer) {
  auto second_step_moves = [](double beta1, double beta2) {
    torch::manual_seed(5);
    Toy model;
    OptimizerOptions o = plain_sgd_like(1e-2);
    o.beta1 = beta1;
    o.beta2 = beta2;
    o.eps = 1e-12;
    TrainEngine engine(model.ptr(), o);
    engine.train_step(toy_batch(4, 3, 1), 4, mse_loss(model));
    std::vector<torch::Tensor> before;
    for (auto& p : model->parameters()) before.push_back(p.detach().clone());
    engine.train_step(toy_batch(4, 3, 2), 4, mse_loss(model));
    double worst = 0;  // largest gap between the move and -lr x sign(gradient), over parameters with a gradient
    for (size_t i = 0; i < before.size(); ++i) {
      const torch::Tensor p = model->parameters()[i];  // parameters() returns a temporary vector
      const auto has_grad = p.grad().abs() > 1e-6;
      const auto gap = ((p.detach() - before[i]) + 1e-2 * p.grad().sign()).abs().masked_select(has_grad);
      if (gap.numel() > 0) worst = std::max(worst, gap.max().item<double>());
    }
    return worst;
  };
  EXPECT_LT(second_step_moves(0.0, 0.0), 1e-7);
  EXPECT_GT(second_step_moves(0.9, 0.999), 1e-4);

  OptimizerOptions o;
  set_adam_betas(o, {0.5, 0.9}, "optim.betas");
  EXPECT_EQ(o.beta1, 0.5);
  EXPECT_EQ(o.beta2, 0.9);
  for (const std::vector<double>& bad : {std::vector<double>{0.9}, std::vector<double>{0.9, 1.0}}) {
    try {
      set_adam_betas(o, bad, "actor.optim.betas");
      ADD_FAILURE() << "accepted " << bad.size() << " betas";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("actor.optim.betas"), std::string::npos) << e.what();
    }
  }
}

TEST(TrainEngine, UsesScheduledLearningRatePerStep) {
  Toy model;
  OptimizerOptions o = plain_sgd_like(1e-2);
  o.schedule.warmup_steps = 2;
  TrainEngine engine(model.ptr(), o);
  auto batch = toy_batch(2, 2, 1);
  EXPECT_DOUBLE_EQ(engine.train_step(batch, 2, mse_loss(model)).lr, 5e-3);
  EXPECT_DOUBLE_EQ(engine.train_step(batch, 2, mse_loss(model)).lr, 1e-2);
  EXPECT_EQ(engine.step(), 2);
}

TEST(TrainEngine, AdamWDoesNotDecayNormsOrBiases) {
  EXPECT_TRUE(excluded_from_weight_decay("model.norm.weight", torch::ones({3, 3})));
  EXPECT_TRUE(excluded_from_weight_decay("q_proj.bias", torch::ones({3})));
  EXPECT_FALSE(excluded_from_weight_decay("q_proj.weight", torch::ones({3, 3})));

  Toy model;
  OptimizerOptions o = plain_sgd_like(0.1);
  o.weight_decay = 0.5;
  TrainEngine engine(model.ptr(), o);
  std::map<std::string, torch::Tensor> before;
  for (auto& item : model->named_parameters()) before[item.key()] = item.value().detach().clone();
  // A loss with zero gradient: AdamW's only effect is the decoupled decay p *= (1 - lr * wd).
  auto stats = engine.train_step(toy_batch(2, 2, 2), 2, [&](const DataProto&) {
    torch::Tensor s = torch::zeros({});
    for (auto& p : model->parameters()) s = s + 0.0 * p.sum();
    return s;
  });
  EXPECT_EQ(stats.grad_norm, 0.0);
  for (auto& item : model->named_parameters()) {
    const auto& name = item.key();
    if (name == "norm_weight" || name == "proj.bias" || name == "out.bias") {
      EXPECT_TRUE(torch::equal(item.value(), before[name])) << name;
    } else {
      EXPECT_TRUE(torch::allclose(item.value(), before[name] * (1 - 0.1 * 0.5))) << name;
    }
  }
}

TEST(TrainEngine, LossDecreasesOnAToyRegression) {
  at::set_num_threads(1);
  Toy model;
  OptimizerOptions o;
  o.schedule.lr = 3e-2;
  TrainEngine engine(model.ptr(), o);
  auto batch = toy_batch(16, 4, 7);
  double first = engine.train_step(batch, 8, mse_loss(model)).loss;
  double last = first;
  for (int i = 0; i < 150; ++i) last = engine.train_step(batch, 8, mse_loss(model)).loss;
  EXPECT_LT(last, 0.5 * first);
}

TEST(TrainEngine, SavedStateResumesIdentically) {
  testing::TempDir dir;
  auto batch = toy_batch(6, 3, 9);
  OptimizerOptions o;
  o.schedule.lr = 1e-2;
  o.schedule.warmup_steps = 3;
  torch::manual_seed(4);
  Toy a;
  TrainEngine ea(a.ptr(), o);
  for (int i = 0; i < 3; ++i) ea.train_step(batch, 3, mse_loss(a));
  ea.save_state(dir.file("optim.pt"));
  // A second model with the same weights and the restored optimizer state.
  Toy b;
  {
    torch::NoGradGuard ng;
    for (size_t i = 0; i < a->parameters().size(); ++i) b->parameters()[i].copy_(a->parameters()[i]);
  }
  TrainEngine eb(b.ptr(), o);
  eb.load_state(dir.file("optim.pt"));
  EXPECT_EQ(eb.step(), 3);
  for (int i = 0; i < 2; ++i) {
    auto sa = ea.train_step(batch, 3, mse_loss(a));
    auto sb = eb.train_step(batch, 3, mse_loss(b));
    EXPECT_EQ(sa.lr, sb.lr);
    EXPECT_EQ(sa.loss, sb.loss);
  }
  for (size_t i = 0; i < a->parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal(a->parameters()[i], b->parameters()[i])) << "param " << i;
  }
  EXPECT_THROW(eb.load_state(dir.file("missing.pt")), Error);
}

// train_step drops gradients before its backward passes instead of zeroing them; a parameter that had a
// gradient before and gets none this step must still see a zero gradient (AdamW decays it and its moments),
// as with libtorch's optimizer.zero_grad(/*set_to_none=*/false) before every step.
TEST(TrainEngine, AParameterWithoutAGradientThisStepIsSteppedAsIfItsGradientWereZeroed) {
  torch::manual_seed(12);
  Toy engine_model, hand_model;
  {
    torch::NoGradGuard ng;
    for (size_t i = 0; i < engine_model->parameters().size(); ++i)
      hand_model->parameters()[i].copy_(engine_model->parameters()[i]);
  }
  OptimizerOptions o = plain_sgd_like(1e-2);
  o.weight_decay = 0.1;
  TrainEngine engine(engine_model.ptr(), o);
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& item : hand_model->named_parameters())
    (excluded_from_weight_decay(item.key(), item.value()) ? no_decay : decay).push_back(item.value());
  auto adamw = [&](double wd) { return torch::optim::AdamWOptions(o.schedule.lr).weight_decay(wd); };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(adamw(o.weight_decay)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(adamw(0.0)));
  torch::optim::AdamW hand(std::move(groups), adamw(0.0));
  const DataProto batch = toy_batch(4, 3, 13);
  // Steps 0 and 2 reach every parameter; step 1 only `out` (proj and norm_weight get no gradient).
  auto loss_of = [&](Toy& m, int step) {
    if (step == 1) return m->out->forward(torch::ones({5, 3})).pow(2).mean();
    return mse_loss(m)(batch);
  };
  for (int step = 0; step < 3; ++step) {
    engine.train_step(batch, 4, [&](const DataProto&) { return loss_of(engine_model, step); });
    hand.zero_grad(/*set_to_none=*/false);
    loss_of(hand_model, step).backward();
    hand.step();
    for (auto& item : engine_model->named_parameters())
      EXPECT_TRUE(torch::equal(item.value(), hand_model->named_parameters()[item.key()]))
          << item.key() << " after step " << step;
  }
}

// A resumed engine knows which parameters have had a gradient (those with Adam moments): a step that reaches
// only some parameters steps the others as if their gradients were zeroed, as the uninterrupted engine does.
TEST(TrainEngine, AResumedStateStepsParametersWithoutAGradientLikeTheUninterruptedEngine) {
  testing::TempDir dir;
  const DataProto batch = toy_batch(4, 3, 13);
  OptimizerOptions o = plain_sgd_like(1e-2);
  o.weight_decay = 0.1;
  auto only_out = [](Toy m) {
    return [m](const DataProto&) mutable { return m->out->forward(torch::ones({5, 3})).pow(2).mean(); };
  };
  // Every parameter gets a gradient in the first step, only `out` in the second.
  torch::manual_seed(21);
  Toy straight;
  TrainEngine straight_engine(straight.ptr(), o);
  straight_engine.train_step(batch, 4, mse_loss(straight));
  straight_engine.save_state(dir.file("optim.pt"));
  const TrainEngine::NamedState by_name = straight_engine.named_state();
  std::vector<torch::Tensor> after_first;
  for (const auto& p : straight->parameters()) after_first.push_back(p.detach().clone());
  straight_engine.train_step(batch, 4, only_out(straight));
  for (bool from_file : {true, false}) {
    Toy resumed;
    {
      torch::NoGradGuard ng;
      for (size_t i = 0; i < after_first.size(); ++i) resumed->parameters()[i].copy_(after_first[i]);
    }
    TrainEngine engine(resumed.ptr(), o);
    if (from_file)
      engine.load_state(dir.file("optim.pt"));
    else
      engine.load_named_state(by_name);
    engine.train_step(batch, 4, only_out(resumed));
    for (auto& item : resumed->named_parameters())
      EXPECT_TRUE(torch::equal(item.value(), straight->named_parameters()[item.key()]))
          << item.key() << (from_file ? " from the file" : " by name");
  }
}

}  // namespace
}  // namespace hybridflow
