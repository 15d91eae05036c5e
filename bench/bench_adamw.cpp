// The per-step passes over the parameters that a training step pays besides its matmuls, timed in
// alternation in one process (the machine's load hits both sides alike): libtorch's AdamW::step against
// fused_adamw_step (same results to the bit), and zeroing the gradients before the backward pass then adding
// the first gradient into them against storing it as it comes. Seconds are scaled to --scale-to parameters
// (494 M: the Qwen2.5-0.5B shape) from --numel parameters held as --tensors tensors.
//   bench_adamw [--numel=67108864] [--tensors=16] [--rounds=5] [--scale-to=494032768] [--threads=0]
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

#include "bench_common.h"
#include "hybridflow/core/platform.h"
#include "hybridflow/engine/fused_adamw.h"

using namespace hybridflow;

namespace {

struct Params {
  std::vector<torch::Tensor> values;
  std::unique_ptr<torch::optim::AdamW> optimizer;
};

Params make_params(int64_t numel, int64_t tensors) {
  Params p;
  for (int64_t i = 0; i < tensors; ++i) {
    auto v = torch::randn({numel / tensors}).set_requires_grad(true);
    v.mutable_grad() = torch::randn({numel / tensors});
    p.values.push_back(v);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(p.values, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(1e-4).weight_decay(0.01)));
  p.optimizer = std::make_unique<torch::optim::AdamW>(std::move(groups), torch::optim::AdamWOptions(1e-4));
  return p;
}

double seconds_of(const std::function<void()>& fn) {
  const double start = bench::now_seconds();
  fn();
  return bench::now_seconds() - start;
}

struct Range {
  double lo = 1e300, hi = 0;
  void add(double s) {
    lo = std::min(lo, s);
    hi = std::max(hi, s);
  }
};

}  // namespace

int main(int argc, char** argv) {
  const int64_t numel = bench::arg_int(argc, argv, "numel", 64LL << 20);
  const int64_t tensors = bench::arg_int(argc, argv, "tensors", 16);
  const int rounds = static_cast<int>(bench::arg_int(argc, argv, "rounds", 5));
  const double scale_to = static_cast<double>(bench::arg_int(argc, argv, "scale-to", 494032768));
  init_threads(static_cast<int>(bench::arg_int(argc, argv, "threads", 0)));
  const double scale = scale_to / static_cast<double>(numel);

  Params libtorch_side = make_params(numel, tensors), fused_side = make_params(numel, tensors);
  libtorch_side.optimizer->step();  // the moments exist from here on
  fused_adamw_step(*fused_side.optimizer);
  // A gradient as the backward pass hands it over: a fresh tensor per parameter.
  std::vector<torch::Tensor> incoming;
  for (const auto& v : fused_side.values) incoming.push_back(torch::randn_like(v));

  Range libtorch_step, fused_step, zero_then_add, store;
  torch::NoGradGuard no_grad;
  for (int r = 0; r < rounds; ++r) {
    libtorch_step.add(seconds_of([&] { libtorch_side.optimizer->step(); }) * scale);
    fused_step.add(seconds_of([&] { fused_adamw_step(*fused_side.optimizer); }) * scale);
    zero_then_add.add(seconds_of([&] {
                        for (size_t i = 0; i < incoming.size(); ++i) {
                          auto& g = libtorch_side.values[i].mutable_grad();
                          g.zero_();
                          g.add_(incoming[i]);
                        }
                      }) *
                      scale);
    store.add(seconds_of([&] {
                for (size_t i = 0; i < incoming.size(); ++i) fused_side.values[i].mutable_grad() = incoming[i];
              }) *
              scale);
  }
  std::printf("per step at %.1f M parameters (measured on %.1f M in %lld tensors, %d alternating rounds, "
              "%d threads): min .. max seconds\n",
              scale_to / 1e6, static_cast<double>(numel) / 1e6, static_cast<long long>(tensors), rounds,
              at::get_num_threads());
  std::printf("  AdamW  libtorch step      %7.3f .. %7.3f\n", libtorch_step.lo, libtorch_step.hi);
  std::printf("  AdamW  fused_adamw_step   %7.3f .. %7.3f   (%.2fx libtorch's best)\n", fused_step.lo, fused_step.hi,
              fused_step.lo / libtorch_step.lo);
  std::printf("  grads  zero_ + add_ first %7.3f .. %7.3f\n", zero_then_add.lo, zero_then_add.hi);
  std::printf("  grads  stored as they come %6.3f .. %7.3f\n", store.lo, store.hi);
  return 0;
}
