// The decode step a drawing CUDA graph captures (the paged decode from static buffers and the draw of the next
// tokens, nothing read back) runs eagerly on the CPU too, and there chooses the tokens the eager step chooses,
// greedy and sampled (temperature, top-k, top-p from the chunk's uniforms). test_cuda_parity replays it as a
// graph on a GPU.
#include <gtest/gtest.h>

#include "hybridflow/kernels/decode_kernels.h"
#include "support/graph_draw_step.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

TEST(GraphDrawStep, TheCapturableStepChoosesTheEagerStepsTokensOnTheCpu) {
  at::set_num_threads(1);
  CausalLM model = testing::spread_logits_model();
  for (const bool greedy : {true, false}) testing::expect_graph_draw_step_matches_eager(model, greedy, 1e-5);
}

// The same through the fused decode kernels' CPU references (kernels::Mode::kEverywhere: the CUDA step's
// arithmetic), where the capturable step makes its rotary tables with one kernel and the eager step with
// rotary_cos_sin's operators (a last fp32 bit of a cosine apart): Qwen2's layout and Qwen3's (q/k norms in the
// fused norm + rotary + cache write kernel).
TEST(GraphDrawStep, TheCapturableStepChoosesTheEagerStepsTokensThroughTheFusedKernels) {
  at::set_num_threads(1);
  const auto saved = kernels::mode();
  kernels::set_mode(kernels::Mode::kEverywhere);
  CausalLM qwen2 = testing::spread_logits_model();
  CausalLM qwen3 = testing::seeded_model(
      testing::tiny_model_config({.vocab_size = 41, .hidden_size = 32, .intermediate_size = 48}, "qwen3-tiny"), 5);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : qwen3->parameters())
      if (p.dim() == 2) p.mul_(6.0);
  }
  for (CausalLM* model : {&qwen2, &qwen3})
    for (const bool greedy : {true, false}) testing::expect_graph_draw_step_matches_eager(*model, greedy, 1e-4);
  kernels::set_mode(saved);
}

}  // namespace
}  // namespace hybridflow
