// fused_adamw_step against libtorch's torch::optim::AdamW::step, step by step: parameters, both moments and
// step counts after every step, with the options the engines use (two groups, decay on one, a learning rate
// that changes every step, clipped gradients, parameters without a gradient in some steps, a
// non-contiguous parameter, tensors longer than one parallel chunk), and ZeRO's flat partitions against
// whole tensors.
#include "hybridflow/engine/fused_adamw.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "hybridflow/core/error.h"
#include "hybridflow/engine/lr_schedule.h"
#include "hybridflow/engine/train_engine.h"

namespace hybridflow {
namespace {

// Float32 units in the last place between a and b, measured at the larger magnitude of the pair (or at
// `floor` where both are smaller, so that values that cancel to near zero are judged at the scale of the
// terms that produced them).
double max_ulps(const torch::Tensor& a, const torch::Tensor& b, double floor) {
  auto scale = torch::maximum(a.abs(), b.abs()).clamp_min(floor).to(torch::kDouble);
  auto ulp = torch::pow(2.0, torch::floor(torch::log2(scale)) - 23);
  return ((a.to(torch::kDouble) - b.to(torch::kDouble)).abs() / ulp).max().item<double>();
}

torch::optim::AdamWOptions options_with_decay(double weight_decay) {
  return torch::optim::AdamWOptions(1e-3).betas({0.9, 0.999}).eps(1e-8).weight_decay(weight_decay);
}

struct TwinParams {
  std::vector<torch::Tensor> fused, reference;
};

// The same values twice, one set for each optimizer. Shapes: an SSE tail (37), a matrix, one longer than
// a parallel chunk (2^15), and a non-contiguous (transposed) leaf.
TwinParams twin_params() {
  torch::manual_seed(5);
  TwinParams t;
  for (auto shape : std::vector<std::vector<int64_t>>{{37}, {64, 33}, {300, 257}, {11}}) {
    auto value = torch::randn(shape);
    t.fused.push_back(value.clone().set_requires_grad(true));
    t.reference.push_back(value.clone().set_requires_grad(true));
  }
  auto transposed = torch::randn({20, 30});
  t.fused.push_back(transposed.clone().t().set_requires_grad(true));
  t.reference.push_back(transposed.clone().t().set_requires_grad(true));
  EXPECT_FALSE(t.fused.back().is_contiguous());
  return t;
}

std::vector<torch::optim::OptimizerParamGroup> decay_groups(const std::vector<torch::Tensor>& p) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{p[1], p[2], p[4]},
                      std::make_unique<torch::optim::AdamWOptions>(options_with_decay(0.1)));
  groups.emplace_back(std::vector<torch::Tensor>{p[0], p[3]},
                      std::make_unique<torch::optim::AdamWOptions>(options_with_decay(0.0)));
  return groups;
}

void set_lr(torch::optim::AdamW& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
}

const torch::optim::AdamWParamState& state_of(torch::optim::AdamW& optimizer, const torch::Tensor& p) {
  auto it = optimizer.state().find(p.unsafeGetTensorImpl());
  if (it == optimizer.state().end()) throw Error("no optimizer state for a parameter");
  return static_cast<const torch::optim::AdamWParamState&>(*it->second);
}

// Bitwise: the fused loop rounds every operation as libtorch's kernels do (the fused multiply-adds of its
// AVX2 / AVX-512 kernels or the separate roundings of its portable ones, and libtorch's own square root),
// so any difference at all is a wrong constant or a wrong order, and the trainers' runs stay the runs they
// were with optimizer.step(). Run with ATEN_CPU_CAPABILITY=default / avx2 to check the other kernels.
// On a mismatch the message gives the distance in float32 ulps (a misplaced epsilon or bias correction is
// thousands, one extra rounding about one).
void expect_bitwise(const torch::Tensor& fused, const torch::Tensor& reference, double floor, const std::string& what) {
  EXPECT_TRUE(torch::equal(fused, reference)) << what << " differs by up to " << max_ulps(fused, reference, floor)
                                              << " ulps";
}

TEST(FusedAdamW, MatchesLibtorchAdamWAfterEveryStep) {
  TwinParams t = twin_params();
  torch::optim::AdamW fused(decay_groups(t.fused), options_with_decay(0.0));
  torch::optim::AdamW reference(decay_groups(t.reference), options_with_decay(0.0));
  LrSchedule schedule;
  schedule.lr = 3e-3;
  schedule.warmup_steps = 4;
  schedule.kind = "cosine";
  schedule.total_steps = 12;
  torch::manual_seed(6);
  for (int64_t step = 0; step < 12; ++step) {
    for (size_t i = 0; i < t.fused.size(); ++i) {
      // Parameter 3 gets no gradient on odd steps: neither optimizer may touch it (no decay, no step count).
      if (i == 3 && step % 2 == 1) {
        t.fused[i].mutable_grad() = torch::Tensor();
        t.reference[i].mutable_grad() = torch::Tensor();
        continue;
      }
      // Gradients of mixed scales, as a real model's layers have them.
      auto g = torch::randn(t.fused[i].sizes()) * std::pow(10.0, static_cast<double>(i % 3) - 1);
      t.fused[i].mutable_grad() = g.clone();
      t.reference[i].mutable_grad() = g.clone();
    }
    const double norm_f = torch::nn::utils::clip_grad_norm_(t.fused, 5.0);
    const double norm_r = torch::nn::utils::clip_grad_norm_(t.reference, 5.0);
    ASSERT_EQ(norm_f, norm_r);
    const double lr = lr_at_step(schedule, step);
    set_lr(fused, lr);
    set_lr(reference, lr);
    fused_adamw_step(fused);
    reference.step();
    for (size_t i = 0; i < t.fused.size(); ++i) {
      const auto& sf = state_of(fused, t.fused[i]);
      const auto& sr = state_of(reference, t.reference[i]);
      ASSERT_EQ(sf.step(), sr.step()) << "parameter " << i << " after step " << step;
      ASSERT_EQ(sf.step(), i == 3 ? step / 2 + 1 : step + 1) << "parameter " << i << " after step " << step;
      const double grad_scale = std::pow(10.0, static_cast<double>(i % 3) - 1);
      const std::string where = " of parameter " + std::to_string(i) + " after step " + std::to_string(step);
      expect_bitwise(t.fused[i].detach(), t.reference[i].detach(), 1e-3, "value" + where);
      expect_bitwise(sf.exp_avg(), sr.exp_avg(), 0.1 * grad_scale, "exp_avg" + where);
      expect_bitwise(sf.exp_avg_sq(), sr.exp_avg_sq(), 1e-3 * grad_scale * grad_scale, "exp_avg_sq" + where);
    }
  }
}

// The path a GPU's parameters take (libtorch's multi-tensor kernel, one launch per group, device and dtype),
// run here on the CPU, where libtorch has the same kernel: its arguments (learning rate, betas, weight decay,
// epsilon, the advanced step count) must give libtorch's step. It rounds in its own order, so the two
// trajectories part by rounding only: by less than 1e-3 of how far the parameters moved (a few ulps of the
// parameters themselves), where a wrong constant or a step count off by one is off by a tenth or more; the
// moments by less than 1e-5 of their size. Every other step carries a clip's factor. The transposed
// parameter takes libtorch's tensor operations beside it, and parameter 3's skipped steps leave its step
// count behind the others (a batch of its own).
TEST(FusedAdamW, TheMultiTensorKernelAgreesWithLibtorchAdamW) {
  TwinParams t = twin_params();
  std::vector<torch::Tensor> start;
  for (const auto& p : t.reference) start.push_back(p.detach().clone());
  const auto relative = [](const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& scale) {
    return ((a - b).abs().max() / scale.abs().max()).item<double>();
  };
  torch::optim::AdamW fused(decay_groups(t.fused), options_with_decay(0.0));
  torch::optim::AdamW reference(decay_groups(t.reference), options_with_decay(0.0));
  torch::manual_seed(8);
  for (int64_t step = 0; step < 12; ++step) {
    for (size_t i = 0; i < t.fused.size(); ++i) {
      const bool skip = i == 3 && step % 2 == 1;
      auto g = skip ? torch::Tensor() : torch::randn(t.fused[i].sizes()) * std::pow(10.0, static_cast<double>(i % 3) - 1);
      t.fused[i].mutable_grad() = skip ? g : g.clone();
      t.reference[i].mutable_grad() = skip ? g : g.clone();
    }
    set_lr(fused, 1e-3 * static_cast<double>(step + 1));
    set_lr(reference, 1e-3 * static_cast<double>(step + 1));
    // Every other step with a clip's factor, which the reference applies to its gradients first.
    const float factor = step % 2 == 0 ? 0.5f : 1.0f;
    for (auto& p : t.reference)
      if (p.grad().defined()) p.mutable_grad().mul_(factor);
    fused_adamw_step(fused, factor, AdamWPath::kMultiTensor);
    reference.step();
    for (size_t i = 0; i < t.fused.size(); ++i) {
      const auto& sf = state_of(fused, t.fused[i]);
      const auto& sr = state_of(reference, t.reference[i]);
      ASSERT_EQ(sf.step(), sr.step()) << "parameter " << i << " after step " << step;
      const std::string where = " of parameter " + std::to_string(i) + " after step " + std::to_string(step);
      EXPECT_LE(relative(t.fused[i].detach(), t.reference[i].detach(), t.reference[i].detach() - start[i]), 1e-3)
          << "value" << where;
      EXPECT_LE(relative(sf.exp_avg(), sr.exp_avg(), sr.exp_avg()), 1e-5) << "exp_avg" << where;
      EXPECT_LE(relative(sf.exp_avg_sq(), sr.exp_avg_sq(), sr.exp_avg_sq()), 1e-5) << "exp_avg_sq" << where;
    }
  }
}

// The trainer's clip folded into the step: fused_adamw_step with clip_grad_norm_'s clamped factor equals
// clip_grad_norm_ then libtorch's step, to the bit, in parameters, moments and the (clipped) gradients left
// behind, for steps that clip and steps under the limit (factor 1), through the loop and the tensor-op path
// (the transposed parameter).
TEST(FusedAdamW, ClipFactorInThePassEqualsClipThenLibtorchStep) {
  TwinParams t = twin_params();
  torch::optim::AdamW fused(decay_groups(t.fused), options_with_decay(0.0));
  torch::optim::AdamW reference(decay_groups(t.reference), options_with_decay(0.0));
  constexpr double kMaxNorm = 5.0;
  torch::manual_seed(8);
  for (int64_t step = 0; step < 6; ++step) {
    const double size = step % 3 == 2 ? 1e-3 : 1.0;  // every third step's norm is under kMaxNorm
    for (size_t i = 0; i < t.fused.size(); ++i) {
      auto g = torch::randn(t.fused[i].sizes()) * size;
      t.fused[i].mutable_grad() = g.clone();
      t.reference[i].mutable_grad() = g.clone();
    }
    std::vector<torch::Tensor> norms;
    for (const auto& p : t.fused) norms.push_back(p.grad().norm(2.0));
    const float factor = torch::clamp(kMaxNorm / (torch::stack(norms).norm(2.0) + 1e-6), std::nullopt, 1.0).item<float>();
    EXPECT_EQ(factor == 1.0f, size < 1) << "step " << step;
    torch::nn::utils::clip_grad_norm_(t.reference, kMaxNorm);
    set_lr(fused, 2e-3);
    set_lr(reference, 2e-3);
    fused_adamw_step(fused, factor);
    reference.step();
    for (size_t i = 0; i < t.fused.size(); ++i) {
      const auto& sf = state_of(fused, t.fused[i]);
      const auto& sr = state_of(reference, t.reference[i]);
      const std::string where = " of parameter " + std::to_string(i) + " after step " + std::to_string(step);
      expect_bitwise(t.fused[i].grad(), t.reference[i].grad(), 1e-3 * size, "clipped gradient" + where);
      expect_bitwise(t.fused[i].detach(), t.reference[i].detach(), 1e-3, "value" + where);
      expect_bitwise(sf.exp_avg(), sr.exp_avg(), 1e-4, "exp_avg" + where);
      expect_bitwise(sf.exp_avg_sq(), sr.exp_avg_sq(), 1e-8, "exp_avg_sq" + where);
    }
  }
}

// ZeRO steps a flat fp32 partition of concatenated parameters; each element's result must not depend on
// where it sits (SSE lane, scalar tail, parallel chunk), so partitions give the whole tensors' step exactly.
TEST(FusedAdamW, FlatPartitionsStepExactlyAsWholeTensors) {
  TwinParams t = twin_params();
  std::vector<torch::Tensor> whole(t.fused.begin(), t.fused.begin() + 4);
  auto flat = torch::cat({whole[0].detach().reshape({-1}), whole[1].detach().reshape({-1}),
                          whole[2].detach().reshape({-1}), whole[3].detach().reshape({-1})});
  // Three partitions with boundaries inside tensors and off any multiple of 4.
  const int64_t n = flat.numel(), cut1 = 1001, cut2 = n - 4097;
  std::vector<torch::Tensor> parts;
  for (auto [b, e] : std::vector<std::pair<int64_t, int64_t>>{{0, cut1}, {cut1, cut2}, {cut2, n}})
    parts.push_back(flat.narrow(0, b, e - b).clone().set_requires_grad(true));
  torch::optim::AdamW on_whole(whole, options_with_decay(0.05).lr(2e-3));
  torch::optim::AdamW on_parts(parts, options_with_decay(0.05).lr(2e-3));
  torch::manual_seed(7);
  for (int step = 0; step < 5; ++step) {
    std::vector<torch::Tensor> flat_grad;
    for (auto& p : whole) {
      p.mutable_grad() = torch::randn(p.sizes());
      flat_grad.push_back(p.grad().reshape({-1}));
    }
    auto g = torch::cat(flat_grad);
    int64_t offset = 0;
    for (auto& p : parts) {
      p.mutable_grad() = g.narrow(0, offset, p.numel()).clone();
      offset += p.numel();
    }
    fused_adamw_step(on_whole);
    fused_adamw_step(on_parts);
    std::vector<torch::Tensor> joined, m_whole, m_parts;
    for (auto& p : whole) {
      joined.push_back(p.detach().reshape({-1}));
      m_whole.push_back(state_of(on_whole, p).exp_avg_sq().reshape({-1}));
    }
    for (auto& p : parts) m_parts.push_back(state_of(on_parts, p).exp_avg_sq());
    ASSERT_TRUE(torch::equal(torch::cat(joined), torch::cat(parts).detach())) << "after step " << step;
    ASSERT_TRUE(torch::equal(torch::cat(m_whole), torch::cat(m_parts))) << "after step " << step;
  }
}

TEST(FusedAdamW, RejectsAmsgrad) {
  auto p = torch::ones({3}).set_requires_grad(true);
  p.mutable_grad() = torch::ones({3});
  torch::optim::AdamW optimizer({p}, options_with_decay(0.0).amsgrad(true));
  EXPECT_THROW(fused_adamw_step(optimizer), Error);
}

// A model trained by TrainEngine (which steps with fused_adamw_step) against the same model trained by hand
// with libtorch's AdamW, with the engine's options: decay groups by name, warm-up, clipping.
struct SmallModelImpl : torch::nn::Module {
  SmallModelImpl() {
    up = register_module("up", torch::nn::Linear(8, 48));
    down = register_module("down", torch::nn::Linear(48, 1));
    norm = register_parameter("norm_weight", torch::ones({48}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return down(torch::tanh(up(x)) * norm).squeeze(-1); }
  torch::nn::Linear up{nullptr}, down{nullptr};
  torch::Tensor norm;
};
TORCH_MODULE(SmallModel);

TEST(FusedAdamW, TrainEngineMatchesAHandWrittenLibtorchLoop) {
  torch::manual_seed(8);
  SmallModel engine_model, hand_model;
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < engine_model->parameters().size(); ++i)
      hand_model->parameters()[i].copy_(engine_model->parameters()[i]);
  }
  OptimizerOptions o;
  o.schedule.lr = 1e-2;
  o.schedule.warmup_steps = 3;
  o.weight_decay = 0.1;
  o.grad_clip = 0.5;
  TrainEngine engine(engine_model.ptr(), o);
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& item : hand_model->named_parameters())
    (excluded_from_weight_decay(item.key(), item.value()) ? no_decay : decay).push_back(item.value());
  ASSERT_EQ(decay.size(), 2u);  // up.weight, down.weight
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(options_with_decay(o.weight_decay)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(options_with_decay(0.0)));
  torch::optim::AdamW hand(std::move(groups), options_with_decay(0.0));
  for (int64_t step = 0; step < 8; ++step) {
    torch::manual_seed(100 + static_cast<uint64_t>(step));
    DataProto batch;
    auto x = torch::randn({16, 8});
    batch.set_tensor("x", x);
    batch.set_tensor("y", x.sum(-1).sin());
    engine.train_step(batch, 16, [&](const DataProto& b) {
      return (engine_model->forward(b.tensor("x")) - b.tensor("y")).pow(2).mean();
    });
    hand.zero_grad();
    (hand_model->forward(x) - x.sum(-1).sin()).pow(2).mean().backward();
    torch::nn::utils::clip_grad_norm_(hand_model->parameters(), o.grad_clip);
    set_lr(hand, lr_at_step(o.schedule, step));
    hand.step();
    auto e = engine_model->named_parameters(), h = hand_model->named_parameters();
    for (const auto& item : e)
      expect_bitwise(item.value().detach(), h[item.key()].detach(), 1e-3, item.key() + " after step " + std::to_string(step));
  }
}

}  // namespace
}  // namespace hybridflow
