// The preset table: the published architectures carry their config.json numbers (checked through the
// parameter totals their model cards publish), survive a config.json round trip, build with the weight
// shapes model_size.h names, and keep their vocabulary while the test shapes take the tokenizer's.
#include "hybridflow/model/model_presets.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "hybridflow/model/model_size.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/model/transformer.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

namespace hybridflow {
namespace {

using ::testing::HasSubstr;
using hybridflow::testing::error_of;

ModelConfig published(const std::string& name) {
  const std::optional<ModelPreset> p = find_model_preset(name);
  EXPECT_TRUE(p && p->published) << name;
  return p ? p->config : ModelConfig{};
}

double total(const std::string& name) { return model_size(published(name)).parameters(); }
double non_embedding(const std::string& name) {
  const ModelSize s = model_size(published(name));
  return s.parameters() - s.embeddings;
}

TEST(ModelPresets, PublishedShapesHaveThePublishedParameterCounts) {
  // Model cards: Qwen3-0.6B 0.6B (0.44B non-embedding), 1.7B (1.4B), 4B 4.0B (3.6B); Qwen2.5-0.5B 0.49B
  // (0.36B), Qwen2.5-7B 7.61B (6.53B); Llama 3.2 1B 1.23B (1,235,814,400 as transformers counts it).
  EXPECT_DOUBLE_EQ(total("qwen3-0.6b"), 596049920.0);
  EXPECT_NEAR(non_embedding("qwen3-0.6b") / 1e9, 0.44, 0.005);
  EXPECT_NEAR(total("qwen3-1.7b") / 1e9, 1.7, 0.03);
  EXPECT_NEAR(non_embedding("qwen3-1.7b") / 1e9, 1.4, 0.01);
  EXPECT_NEAR(total("qwen3-4b") / 1e9, 4.0, 0.03);
  EXPECT_NEAR(non_embedding("qwen3-4b") / 1e9, 3.6, 0.04);
  EXPECT_DOUBLE_EQ(total("llama3.2-1b"), 1235814400.0);
  EXPECT_DOUBLE_EQ(total("qwen2.5-0.5b"), 494032768.0);
  EXPECT_NEAR(non_embedding("qwen2.5-0.5b") / 1e9, 0.36, 0.005);
  EXPECT_DOUBLE_EQ(total("qwen2.5-7b"), 7615616512.0);
  EXPECT_NEAR(non_embedding("qwen2.5-7b") / 1e9, 6.53, 0.005);
  // Llama 2 7B and 70B as transformers counts them.
  EXPECT_DOUBLE_EQ(total("llama-7b"), 6738415616.0);
  EXPECT_DOUBLE_EQ(total("llama-70b"), 68976648192.0);
  // Qwen3-30B-A3B's card: 30.5B in total, 3.3B activated (8 of 128 experts per layer).
  EXPECT_NEAR(total("qwen3-30b-a3b") / 1e9, 30.5, 0.05);
  EXPECT_NEAR(model_size(published("qwen3-30b-a3b")).active_parameters() / 1e9, 3.3, 0.06);
  // num_parameters() is the same count in integers.
  for (const ModelPreset& p : model_presets()) {
    if (!p.published) continue;
    EXPECT_DOUBLE_EQ(static_cast<double>(p.config.num_parameters()), total(p.name)) << p.name;
  }
}

TEST(ModelPresets, PublishedShapesCarryTheirArchitecturesFields) {
  const ModelConfig q3 = published("qwen3-0.6b");
  EXPECT_EQ(q3.architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(q3.head_dim(), 128);  // explicit: 16 heads x 128 = 2048 > hidden 1024
  EXPECT_TRUE(q3.qk_norm());
  EXPECT_FALSE(q3.attention_bias);
  EXPECT_TRUE(q3.tie_word_embeddings);
  EXPECT_EQ(q3.max_position_embeddings, 40960);
  EXPECT_EQ(q3.rope_theta, 1e6);
  const ModelConfig q25 = published("qwen2.5-7b");
  EXPECT_EQ(q25.model_type, "qwen2");
  EXPECT_TRUE(q25.attention_bias);
  EXPECT_FALSE(q25.o_proj_bias());
  EXPECT_FALSE(q25.tie_word_embeddings);
  EXPECT_EQ(q25.vocab_size, 152064);
  const ModelConfig l32 = published("llama3.2-1b");
  EXPECT_EQ(l32.rope_scaling.type, "llama3");
  EXPECT_EQ(l32.rope_scaling.factor, 32.0);
  EXPECT_EQ(l32.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(l32.head_dim(), 64);
  EXPECT_EQ(l32.rms_norm_eps, 1e-5);
  for (const ModelPreset& p : model_presets()) {
    EXPECT_NO_THROW(p.published ? p.config.validate() : preset_model_config(p.name, 64).validate()) << p.name;
    EXPECT_FALSE(p.source.empty()) << p.name;
  }
}

TEST(ModelPresets, PublishedConfigsSurviveAConfigJsonRoundTrip) {
  hybridflow::testing::TempDir dir;
  for (const char* name : {"qwen3-0.6b", "llama3.2-1b", "qwen2.5-7b", "qwen3-30b-a3b"}) {
    const ModelConfig c = published(name);
    save_model_config(c, dir.file(std::string(name) + ".json"));
    const ModelConfig back = load_model_config(dir.file(std::string(name) + ".json"));
    EXPECT_EQ(back.num_parameters(), c.num_parameters()) << name;
    EXPECT_EQ(back.head_dim(), c.head_dim()) << name;
    EXPECT_EQ(back.qk_norm(), c.qk_norm()) << name;
    EXPECT_EQ(back.rope_scaling.type, c.rope_scaling.type) << name;
    EXPECT_EQ(back.rope_scaling.factor, c.rope_scaling.factor) << name;
    EXPECT_EQ(back.max_position_embeddings, c.max_position_embeddings) << name;
    EXPECT_EQ(back.rms_norm_eps, c.rms_norm_eps) << name;
    EXPECT_EQ(back.rope_theta, c.rope_theta) << name;
    EXPECT_EQ(model_size(back).active_parameters(), model_size(c).active_parameters()) << name;
  }
}

TEST(ModelPresets, OneLayerOfAPublishedShapeBuildsWithTheNamedWeightShapes) {
  at::set_num_threads(1);
  for (const char* name : {"qwen3-0.6b", "qwen2.5-0.5b"}) {
    ModelConfig c = published(name);
    c.num_hidden_layers = 1;  // one real layer; a small vocabulary keeps the embedding cheap
    c.vocab_size = 512;
    CausalLM model(c);
    std::map<std::string, std::vector<int64_t>> built;
    for (const auto& item : model->named_parameters()) built[item.key()] = item.value().sizes().vec();
    EXPECT_EQ(built, expected_weight_shapes(c)) << name;
  }
  // Qwen3-30B-A3B's layer with its 128 experts (narrowed, to build in a moment) under transformers' names.
  ModelConfig moe = published("qwen3-30b-a3b");
  moe.num_hidden_layers = 1;
  moe.vocab_size = 512;
  moe.moe.moe_intermediate_size = 4;
  CausalLM model(moe);
  std::map<std::string, std::vector<int64_t>> built;
  for (const auto& item : model->named_parameters()) built[item.key()] = item.value().sizes().vec();
  EXPECT_EQ(built, expected_weight_shapes(moe));
  EXPECT_EQ(built.count("model.layers.0.mlp.experts.127.down_proj.weight"), 1u);
  EXPECT_EQ(built.at("model.layers.0.mlp.gate.weight"), (std::vector<int64_t>{128, 2048}));
}

TEST(ModelPresets, PublishedShapesKeepTheirVocabularyAndTestShapesTakeTheTokenizers) {
  EXPECT_EQ(preset_model_config("qwen3-0.6b", 151669).vocab_size, 151936);  // Qwen pads its embedding
  EXPECT_EQ(preset_model_config("tiny", 77).vocab_size, 77);
  EXPECT_EQ(preset_model_config("qwen3-tiny", 77).explicit_head_dim, 48);
  EXPECT_THAT(error_of([] { preset_model_config("qwen3-0.6b", 200000); }),
              HasSubstr("model preset 'qwen3-0.6b' has a vocabulary of 151936 rows"));
  EXPECT_THAT(error_of([] { preset_model_config("qwen3-7b", 100); }),
              HasSubstr("unknown model preset 'qwen3-7b'; expected one of: tiny, "));
  EXPECT_THAT(model_preset_list(true), HasSubstr("qwen2.5-0.5b, qwen3-0.6b, llama3.2-1b, qwen3-1.7b, qwen3-4b"));
  EXPECT_EQ(model_preset_list(true).find("tiny"), std::string::npos);
}

TEST(TrainingMemoryFormula, TermsByHandForBf16AndFp32) {
  const ModelConfig c = published("qwen3-0.6b");
  const double p = 596049920.0;
  TrainingMemoryOptions o;  // bf16, TrainEngine's accounting
  o.micro_rows = 2;
  o.sequence = 512;
  TrainingMemory m = training_memory(c, o);
  EXPECT_DOUBLE_EQ(m.weights, 2 * p);
  EXPECT_DOUBLE_EQ(m.grads, 6 * p);  // bf16 micro-batch gradients + fp32 accumulation
  EXPECT_DOUBLE_EQ(m.masters, 4 * p);
  EXPECT_DOUBLE_EQ(m.adam, 8 * p);
  EXPECT_DOUBLE_EQ(m.activations, 28.0 * 2 * 512 * 1024 * 17 * 2);
  EXPECT_DOUBLE_EQ(m.checkpointed_activations, 28.0 * 2 * 512 * 1024 * 2 + 2.0 * 512 * 1024 * 17 * 2);
  EXPECT_DOUBLE_EQ(m.logits, 2.0 * 512 * 151936 * 8);
  EXPECT_DOUBLE_EQ(m.peak(false), 20 * p + m.activations + m.logits);
  // ZeRO over 4 ranks partitions Adam's moments only; tp 2 halves everything else per rank.
  o.zero = 4;
  o.tp = 2;
  m = training_memory(c, o);
  EXPECT_DOUBLE_EQ(m.adam, 8 * p / 2 / 4);
  EXPECT_DOUBLE_EQ(m.masters, 4 * p / 2);
  EXPECT_DOUBLE_EQ(m.logits, 2.0 * 512 * 151936 / 2 * 8);
  // The planner's (Megatron's) accounting: gradients in the weights' dtype, masters partitioned with Adam.
  o.fp32_gradients = false;
  o.masters_partitioned = true;
  m = training_memory(c, o);
  EXPECT_DOUBLE_EQ(m.grads, 2 * p / 2);
  EXPECT_DOUBLE_EQ(m.masters, 4 * p / 2 / 4);
  EXPECT_DOUBLE_EQ(m.optimizer, 12 * p / 2 / 4);
  // fp32: no masters, 4-byte weights and gradients.
  o = {};
  o.weight_bytes = 4;
  m = training_memory(c, o);
  EXPECT_DOUBLE_EQ(m.masters, 0.0);
  EXPECT_DOUBLE_EQ(m.grads, 4 * p);
  EXPECT_DOUBLE_EQ(m.state(), 16 * p);
  EXPECT_THAT(error_of([&] {
                o.weight_bytes = 3;
                training_memory(c, o);
              }),
              HasSubstr("weight bytes must be 2 (bf16 / fp16) or 4"));
}

}  // namespace
}  // namespace hybridflow
