// The decode step a drawing CUDA graph captures (the paged decode from static buffers and the draw of the next
// tokens, nothing read back) runs eagerly on the CPU too, and there chooses the tokens the eager step chooses,
// greedy and sampled (temperature, top-k, top-p from the chunk's uniforms). test_cuda_parity replays it as a
// graph on a GPU.
#include <gtest/gtest.h>

#include "support/graph_draw_step.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

TEST(GraphDrawStep, TheCapturableStepChoosesTheEagerStepsTokensOnTheCpu) {
  at::set_num_threads(1);
  CausalLM model = testing::spread_logits_model();
  for (const bool greedy : {true, false}) testing::expect_graph_draw_step_matches_eager(model, greedy, 1e-5);
}

}  // namespace
}  // namespace hybridflow
