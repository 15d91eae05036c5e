// Model presets carry the published dimensions: their parameter counts equal the published ones, and the
// FLOP and KV formulas match hand computation.
#include <gtest/gtest.h>

#include "hybridflow/core/error.h"
#include "hybridflow/placement/model_shape.h"

#include "hybridflow/model/model_config.h"

using namespace hybridflow::placement;

TEST(ModelShape, PresetsHaveThePublishedParameterCounts) {
  // Llama 2: 6,738,415,616 (7B) and 68,976,648,192 (70B), as transformers counts them.
  EXPECT_DOUBLE_EQ(model_preset("llama-7b").parameters(false), 6738415616.0);
  EXPECT_DOUBLE_EQ(model_preset("llama-70b").parameters(false), 68976648192.0);
  EXPECT_NEAR(model_preset("llama-13b").parameters(false) / 1e9, 13.016, 0.001);
  EXPECT_NEAR(model_preset("llama-34b").parameters(false) / 1e9, 33.74, 0.01);  // Code Llama 34B
  // Qwen2.5: 6.53B non-embedding parameters in the 7B (its model card), 72.7B and 32.8B in all (the
  // safetensors counts of the 72B and 32B).
  const ModelShape q7 = model_preset("qwen2.5-7b");
  EXPECT_NEAR((q7.parameters(false) - 2.0 * q7.vocab * q7.hidden) / 1e9, 6.53, 0.01);
  EXPECT_NEAR(model_preset("qwen2.5-72b").parameters(false) / 1e9, 72.7, 0.1);
  EXPECT_NEAR(model_preset("qwen2.5-32b").parameters(false) / 1e9, 32.8, 0.1);
  for (const auto& name : model_preset_names()) EXPECT_NO_THROW(model_preset(name).validate()) << name;
}

TEST(ModelShape, PresetsAreTheModelLayersPublishedShapes) {
  // One table: the planner's presets are the model layer's published architectures, the small ones included.
  for (const auto& name : {"qwen2.5-0.5b", "qwen3-0.6b", "llama3.2-1b", "qwen3-1.7b", "qwen3-4b", "qwen2.5-7b"}) {
    const ModelShape m = model_preset(name);
    const hybridflow::ModelConfig c = hybridflow::preset_model_config(name, 1);
    EXPECT_DOUBLE_EQ(m.parameters(false), static_cast<double>(c.num_parameters())) << name;
    EXPECT_EQ(m.head_dim, c.head_dim()) << name;
    EXPECT_EQ(m.qk_norm, c.qk_norm()) << name;
  }
  // Qwen3's q/k norms count (2 x head_dim per layer) and its heads are 128 wide whatever the hidden size.
  EXPECT_DOUBLE_EQ(model_preset("qwen3-0.6b").parameters(false), 596049920.0);
  EXPECT_EQ(model_preset("qwen3-0.6b").head_dim, 128);
  EXPECT_DOUBLE_EQ(model_preset("llama3.2-1b").parameters(false), 1235814400.0);
  // A hand-built shape keeps the layout it had: q/k/v biases mean Qwen2's (no o_proj bias).
  ModelShape m = model_preset("qwen2.5-7b");
  m.model_type.clear();
  EXPECT_DOUBLE_EQ(m.parameters(false), 7615616512.0);
}

TEST(ModelShape, AValueHeadReplacesTheLanguageModelHead) {
  const ModelShape m = model_preset("llama-7b");
  EXPECT_DOUBLE_EQ(m.parameters(false) - m.parameters(true), 32000.0 * 4096 - 4096);
}

TEST(ModelShape, FlopsAndKvBytesByHand) {
  ModelShape m;
  m.layers = 2;
  m.hidden = 8;
  m.intermediate = 16;
  m.heads = 2;
  m.kv_heads = 1;
  m.head_dim = 4;
  m.vocab = 10;
  // Per layer: q 8x8, k and v 8x4 each, o 8x8, MLP 3 x 8 x 16 = 64+32+32+64+384 = 576 matmul parameters.
  EXPECT_DOUBLE_EQ(m.matmul_parameters(false), 2 * 576 + 80);
  EXPECT_DOUBLE_EQ(m.matmul_parameters(true), 2 * 576 + 8);
  // 3 tokens of sequences of 6: 2 x matmul params + 4 x layers x heads x head_dim x (6 / 2) per token.
  EXPECT_DOUBLE_EQ(m.forward_flops(3, 6, false), 3 * (2.0 * 1232 + 4.0 * 2 * 2 * 4 * 3));
  EXPECT_DOUBLE_EQ(m.decode_flops(5), 2.0 * 1232 + 4.0 * 2 * 2 * 4 * 5);
  EXPECT_DOUBLE_EQ(m.kv_bytes_per_token(2), 2.0 * 2 * 1 * 4 * 2);
}

TEST(ModelShape, UnknownPresetsAndBadShapesAreNamed) {
  try {
    model_preset("llama-8b");
    FAIL();
  } catch (const hybridflow::Error& e) {
    EXPECT_NE(std::string(e.what()).find("llama-70b"), std::string::npos) << e.what();
  }
  ModelShape m = model_preset("llama-7b");
  m.kv_heads = 5;
  EXPECT_THROW(m.validate(), hybridflow::Error);
}

// A mixture of experts holds every expert (memory, weight bytes) and computes with num_experts_per_tok of them
// per token (FLOPs): Qwen3-30B-A3B is 30.5B parameters, 3.3B active.
TEST(ModelShape, MixtureOfExpertsCountsActiveAndTotalParametersSeparately) {
  const ModelShape m = model_preset("qwen3-30b-a3b");
  EXPECT_EQ(m.moe.num_experts, 128);
  EXPECT_NEAR(m.parameters(false) / 1e9, 30.5, 0.05);
  EXPECT_NEAR(m.active_parameters(false) / 1e9, 3.3, 0.06);
  // Per token: every matmul weight but the 120 idle experts of each layer.
  const double expert = 3.0 * 2048 * 768;
  const double idle = 48.0 * (128 - 8) * expert;
  const double all_matmuls = m.parameters(false) - 151936.0 * 2048 - 48 * 2 * 2048 - 2048;  // less embedding, norms
  EXPECT_DOUBLE_EQ(m.matmul_parameters(false), all_matmuls - idle);
  EXPECT_DOUBLE_EQ(m.model_config().num_parameters(), m.parameters(false));
  const ModelShape dense = model_preset("qwen3-4b");
  EXPECT_DOUBLE_EQ(dense.active_parameters(false), dense.parameters(false));
}
