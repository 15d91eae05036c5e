// The training-memory formula (model/model_size.h) that `hybridflow info` prints and the planner budgets
// with, against what TrainEngine really allocates at a small shape: the bytes of the built model's
// parameters, and the bytes of the optimizer state (fp32 masters and Adam's moments) after a step.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hybridflow/engine/model_log_probs.h"
#include "hybridflow/engine/train_engine.h"
#include "hybridflow/model/model_presets.h"
#include "hybridflow/model/model_size.h"
#include "hybridflow/model/transformer.h"

namespace hybridflow {
namespace {

double parameter_bytes(torch::nn::Module& module) {
  double bytes = 0;
  for (const auto& p : module.parameters()) bytes += static_cast<double>(p.numel() * p.element_size());
  return bytes;
}

// One optimizer step over a 2 x 12-token batch with a loss that reaches every parameter.
void take_one_step(TrainEngine& engine, CausalLM model, int64_t vocab) {
  torch::manual_seed(5);
  DataProto batch;
  batch.set_tensor("input_ids", torch::randint(3, vocab, {2, 12}, torch::kLong));
  batch.set_tensor("attention_mask", torch::ones({2, 12}, torch::kLong));
  engine.train_step(
      batch, 2,
      [model](const DataProto& m) mutable {
        return -response_log_probs(model, m.tensor("input_ids"), m.tensor("attention_mask"), 6).log_probs.mean();
      },
      "", LossWeighting::kRowMean);
}

class TrainingMemoryOfPreset : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainingMemoryOfPreset, WeightsMastersAndAdamAreWhatTheEngineAllocates) {
  const ModelConfig config = preset_model_config(GetParam(), 96);
  for (const bool bf16 : {true, false}) {
    torch::manual_seed(1);
    CausalLM model(config);
    if (bf16) model->to(torch::kBFloat16);
    TrainingMemoryOptions options;
    options.weight_bytes = bf16 ? 2 : 4;
    const TrainingMemory expected = training_memory(config, options);
    EXPECT_DOUBLE_EQ(parameter_bytes(*model), expected.weights) << GetParam() << (bf16 ? " bf16" : " fp32");
    TrainEngine engine(model.ptr(), OptimizerOptions{});
    take_one_step(engine, model, config.vocab_size);
    ASSERT_EQ(engine.mixed_precision(), bf16);
    ASSERT_EQ(engine.step(), 1);
    // optimizer_state_numel counts fp32 elements: the masters (mixed precision) and both Adam moments.
    EXPECT_DOUBLE_EQ(static_cast<double>(engine.optimizer_state_numel()) * 4.0, expected.masters + expected.adam)
        << GetParam() << (bf16 ? " bf16" : " fp32");
    EXPECT_EQ(expected.masters > 0, bf16);
  }
}

INSTANTIATE_TEST_SUITE_P(TestShapes, TrainingMemoryOfPreset,
                         ::testing::Values("tiny", "qwen2-tiny", "qwen3-tiny"));

TEST(TrainingMemory, AValueHeadModelHasTheCriticsParameters) {
  const ModelConfig config = preset_model_config("qwen2-tiny", 96);
  CausalLM critic(config, HeadKind::kValue);
  TrainingMemoryOptions options;
  options.weight_bytes = 4;
  options.value_head = true;
  const TrainingMemory expected = training_memory(config, options);
  EXPECT_DOUBLE_EQ(parameter_bytes(*critic), expected.weights);
  EXPECT_EQ(expected.logits, 0.0);
}

}  // namespace
}  // namespace hybridflow
