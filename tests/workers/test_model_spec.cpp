// Worker models are built from a spec the controller sends. A critic started from a language model
// directory gets a value head the directory does not have; it must come out the same in every run and
// on every rank, or two runs of one config (and a run and its resumed twin) diverge from step 1.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hybridflow/model/pretrained.h"
#include "hybridflow/model/tokenizer.h"
#include "hybridflow/workers/model_spec.h"
#include "hybridflow/workers/role_specs.h"
#include "support/temp_dir.h"

using namespace hybridflow;

namespace {

torch::Tensor value_head(const nlohmann::json& spec) {
  return build_model(spec.get<ModelSpec>(), HeadKind::kValue)->named_parameters()["score.weight"].clone();
}

TEST(ModelSpec, FreshValueHeadOnALanguageModelDirIsSeededByInitSeed) {
  hybridflow::testing::TempDir dir;
  const Tokenizer tok = Tokenizer::from_alphabet("0123456789+=");
  nlohmann::json preset = {{"preset", "tiny"}, {"vocab_size", tok.vocab_size()}, {"hidden_size", 32},
                           {"num_hidden_layers", 1}, {"num_attention_heads", 2}, {"num_key_value_heads", 1},
                           {"intermediate_size", 64}};
  save_pretrained(dir.path(), build_model(preset.get<ModelSpec>(), HeadKind::kLanguageModel), tok);

  const nlohmann::json spec = {{"path", dir.path()}, {"init_seed", 3}};
  torch::manual_seed(1);  // whatever the process drew before must not matter
  const auto first = value_head(spec);
  torch::manual_seed(2);
  torch::randn({100});
  const auto second = value_head(spec);
  EXPECT_TRUE(torch::equal(first, second));

  nlohmann::json other = spec;
  other["init_seed"] = 4;
  EXPECT_FALSE(torch::equal(first, value_head(other)));
}

}  // namespace

// The controller sends each worker its model spec as JSON: the adapters' selection, regular expressions
// included, must arrive as it left, or workers would adapt other modules than the controller checked.
TEST(ModelSpec, LoraSelectionReachesTheWorkersAsSent) {
  ModelSpec sent;
  sent.lora.rank = 8;
  sent.lora.target_modules = {};
  sent.lora.target_regex = R"(model\.layers\.[0-3]\..*_proj)";
  sent.lora.exclude_modules = {"layers.0.mlp.down_proj"};
  sent.lora.exclude_regex = ".*visual.*";
  const ModelSpec got = nlohmann::json(sent).get<ModelSpec>();
  EXPECT_EQ(got.lora.rank, 8);
  EXPECT_TRUE(got.lora.target_modules.empty());
  EXPECT_EQ(got.lora.target_regex, sent.lora.target_regex);
  EXPECT_EQ(got.lora.exclude_modules, sent.lora.exclude_modules);
  EXPECT_EQ(got.lora.exclude_regex, sent.lora.exclude_regex);
}
