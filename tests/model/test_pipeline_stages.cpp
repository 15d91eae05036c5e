// A CausalLM split into pipeline stages in one process: each stage holds its layers under their global
// Hugging Face names (plus the embedding, norm and head where they belong), and running the stages one after
// another on the same weights gives the whole model's logits and values.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <set>
#include <string>

#include "hybridflow/model/tensor_parallel_layout.h"
#include "hybridflow/model/transformer.h"
#include "support/error_of.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

ModelConfig four_layer_config(bool tied) {
  ModelConfig c = testing::tiny_model_config(
      {.vocab_size = 48, .hidden_size = 16, .intermediate_size = 32, .num_hidden_layers = 4});
  c.tie_word_embeddings = tied;
  return c;
}

std::set<std::string> names_of(CausalLMImpl& model) {
  std::set<std::string> out;
  for (const auto& item : model.named_parameters()) out.insert(item.key());
  return out;
}

TEST(PipelineStages, StagesHoldTheirLayersUnderGlobalNames) {
  for (bool tied : {false, true}) {
    const ModelConfig c = four_layer_config(tied);
    CausalLM whole(c);
    std::set<std::string> covered;
    for (int s = 0; s < 2; ++s) {
      CausalLM stage(c, HeadKind::kLanguageModel, TensorParallelGroup{}, PipelineStage{s, 2});
      const auto names = names_of(*stage);
      EXPECT_EQ(names.count("model.layers." + std::to_string(2 * s) + ".mlp.up_proj.weight"), 1u);
      EXPECT_EQ(names.count("model.layers." + std::to_string(2 * (1 - s)) + ".mlp.up_proj.weight"), 0u);
      EXPECT_EQ(names.count("model.norm.weight"), s == 1 ? 1u : 0u);
      EXPECT_EQ(names.count("lm_head.weight"), !tied && s == 1 ? 1u : 0u);
      // A tied head needs the embedding on the last stage as well.
      EXPECT_EQ(names.count("model.embed_tokens.weight"), s == 0 || tied ? 1u : 0u);
      covered.insert(names.begin(), names.end());
    }
    EXPECT_EQ(covered, names_of(*whole)) << "tied=" << tied;
  }
}

TEST(PipelineStages, StagesInSequenceGiveTheWholeModelsOutputs) {
  torch::manual_seed(7);
  auto ids = torch::randint(0, 48, {3, 6}, torch::kLong);
  auto mask = torch::ones({3, 6}, torch::kLong);
  mask[0][0] = 0;  // left padding
  mask[2][5] = 0;  // right padding
  for (bool tied : {false, true}) {
    for (HeadKind head : {HeadKind::kLanguageModel, HeadKind::kValue}) {
      const ModelConfig c = four_layer_config(tied);
      torch::manual_seed(11);
      CausalLM whole(c, head);
      const auto full = gather_full_state(*whole);
      torch::NoGradGuard no_grad;
      const ForwardOutput want = whole->forward(ids, mask);
      for (int stages : {2, 4}) {
        torch::Tensor h;
        ForwardOutput got;
        for (int s = 0; s < stages; ++s) {
          CausalLM stage(c, head, TensorParallelGroup{}, PipelineStage{s, stages});
          load_full_state(*stage, full);
          if (s > 0) stage->set_stage_input(h);
          if (s + 1 < stages)
            h = stage->hidden_states(ids, mask);
          else
            got = stage->forward(ids, mask);
        }
        const std::string what = "stages=" + std::to_string(stages) + " tied=" + std::to_string(tied);
        if (head == HeadKind::kLanguageModel)
          EXPECT_TRUE(torch::allclose(got.logits, want.logits, 1e-5, 1e-5)) << what;
        else
          EXPECT_TRUE(torch::allclose(got.values, want.values, 1e-5, 1e-5)) << what;
      }
    }
  }
}

TEST(PipelineStages, ALaterStageWithoutItsInputOrAHeadlessStageSaysWhatIsMissing) {
  const ModelConfig c = four_layer_config(false);
  auto ids = torch::zeros({1, 3}, torch::kLong);
  CausalLM second(c, HeadKind::kLanguageModel, TensorParallelGroup{}, PipelineStage{1, 2});
  const std::string no_input = testing::error_of([&] { second->forward(ids, {}); });
  EXPECT_NE(no_input.find("pipeline stage 1 needs the previous stage's hidden states"), std::string::npos)
      << no_input;
  second->set_stage_input(torch::zeros({2, 3, c.hidden_size}));
  const std::string wrong_shape = testing::error_of([&] { second->forward(ids, {}); });
  EXPECT_NE(wrong_shape.find("got hidden states of shape [2, 3, 16]"), std::string::npos) << wrong_shape;
  CausalLM first(c, HeadKind::kLanguageModel, TensorParallelGroup{}, PipelineStage{0, 2});
  const std::string no_head = testing::error_of([&] { first->forward(ids, {}); });
  EXPECT_NE(no_head.find("has no head"), std::string::npos) << no_head;
  const std::string uneven =
      testing::error_of([&] { CausalLM(c, HeadKind::kLanguageModel, TensorParallelGroup{}, PipelineStage{0, 3}); });
  EXPECT_NE(uneven.find("num_hidden_layers = 4 does not divide by the pipeline-parallel size 3"), std::string::npos)
      << uneven;
}

}  // namespace
}  // namespace hybridflow
