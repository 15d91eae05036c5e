#include "hybridflow/perf/lora_bench.h"

#include <torch/torch.h>

#include <algorithm>
#include <vector>

#include "hybridflow/core/cpu_memory.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/steady_seconds.h"
#include "hybridflow/model/lora.h"
#include "hybridflow/model/transformer.h"

namespace hybridflow {
namespace {

int64_t lora_bench_bytes(const torch::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }

}  // namespace

LoraStepMeasurement measure_lora_step(const ModelConfig& config, int64_t lora_rank, double lora_alpha, int64_t batch,
                                      int64_t seq, int64_t steps) {
  HF_CHECK(batch > 0 && seq >= 2 && steps > 0, "bench lora: needs --batch > 0, a sequence of at least 2 tokens ",
           "and --steps > 0");
  HF_CHECK(lora_rank >= 0, "bench lora: --lora-rank must be >= 0 (0 = full fine-tuning), got ", lora_rank);
  install_cpu_memory_tracking();
  torch::manual_seed(0);
  CausalLM model(config);
  if (lora_rank > 0) {
    LoraConfig lora;
    lora.rank = lora_rank;
    lora.alpha = lora_alpha;
    model->add_lora(lora, /*seed=*/1);
  }
  model->train();
  std::vector<torch::Tensor> trainable;
  LoraStepMeasurement m;
  m.lora_rank = lora_rank;
  for (const auto& p : model->parameters()) {
    m.parameters += p.numel();
    m.weight_bytes += lora_bench_bytes(p);
    if (p.requires_grad()) {
      trainable.push_back(p);
      m.trainable += p.numel();
    }
  }
  torch::optim::AdamW optimizer(trainable, torch::optim::AdamWOptions(1e-4));
  torch::manual_seed(1);
  const auto input = torch::randint(3, config.vocab_size, {batch, seq}, torch::kLong);
  const auto mask = torch::ones_like(input);
  auto step = [&] {
    optimizer.zero_grad();
    auto logits = model->forward(input, mask).logits;
    auto log_probs = torch::log_softmax(logits.slice(1, 0, seq - 1), -1);
    (-log_probs.gather(-1, input.slice(1, 1).unsqueeze(-1)).mean()).backward();
    m.grad_bytes = 0;
    for (const auto& p : model->parameters()) m.grad_bytes += lora_bench_bytes(p.grad());
    optimizer.step();
  };
  step();  // warm-up: AdamW's state is made at the first step
  for (const auto& p : trainable) {
    auto found = optimizer.state().find(p.unsafeGetTensorImpl());
    if (found == optimizer.state().end()) continue;
    const auto& state = static_cast<const torch::optim::AdamWParamState&>(*found->second);
    m.optimizer_bytes += lora_bench_bytes(state.exp_avg()) + lora_bench_bytes(state.exp_avg_sq()) +
                         lora_bench_bytes(state.max_exp_avg_sq());
  }
  // The fastest of the timed steps: on a machine shared with other work the mean measures the neighbours.
  m.seconds = 1e300;
  for (int64_t i = 0; i < steps; ++i) {
    const double start = steady_seconds();
    step();
    m.seconds = std::min(m.seconds, steady_seconds() - start);
  }
  optimizer.zero_grad();  // the peak of a step from where a step starts: no gradients held
  m.step_peak_bytes = peak_cpu_bytes_during(step);
  return m;
}

}  // namespace hybridflow
