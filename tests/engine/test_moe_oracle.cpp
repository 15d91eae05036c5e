// transformers as the reference for the mixture-of-experts types: random tiny Qwen2-MoE, Qwen3-MoE and Mixtral
// models written by transformers load here with the same logits, load-balancing loss and greedy continuation,
// and models written here load in transformers with the same logits and loss. tests/model/moe_oracle.py does
// the Python side in one process.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/model/pretrained.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"
#include "support/transformers_oracle.h"

namespace hybridflow {
namespace {

using testing::max_diff_on_real_tokens;
using testing::read_tensors;

// Must equal hf_oracle.py's ALPHABET, PAD, EOS and MAX_NEW_TOKENS.
constexpr char kAlphabet[] = "0123456789+=abcdefghij ";
constexpr int64_t kPad = 0, kEos = 2, kMaxNewTokens = 6;
// fp32; the order of a GEMM's sums depends on the CPU's kernels (1.4e-5 on an AVX-only AMD EPYC, under 1e-5 on an
// AVX-512 Xeon).
constexpr double kTolerance = 5e-5;

// The reverse direction's models: other choices than moe_oracle.py's (dense layers by decoder_sparse_step,
// normalised qwen2_moe weights, one routed expert per token, untied heads, Mixtral without a window).
ModelConfig hybridflow_config(const std::string& name, const Tokenizer& tok) {
  ModelConfig c = testing::tiny_model_config(tok, {.hidden_size = 32,
                                                   .intermediate_size = 24,
                                                   .num_hidden_layers = 3,
                                                   .num_attention_heads = 4,
                                                   .num_key_value_heads = 2,
                                                   .max_position_embeddings = 64});
  c.model_type = name;
  c.architecture = causal_lm_architecture(name);
  c.rope_theta = 3000.0;
  c.moe.router_aux_loss_coef = 0.05;
  if (name == "qwen2_moe") {
    c.attention_bias = true;
    c.moe.num_experts = 5;
    c.moe.num_experts_per_tok = 2;
    c.moe.moe_intermediate_size = 8;
    c.moe.shared_expert_intermediate_size = 16;
    c.moe.norm_topk_prob = true;
    c.moe.decoder_sparse_step = 2;
    c.moe.output_router_logits = true;
  } else if (name == "qwen3_moe") {
    c.explicit_head_dim = 12;
    c.tie_word_embeddings = true;
    c.moe.num_experts = 6;
    c.moe.num_experts_per_tok = 1;
    c.moe.moe_intermediate_size = 12;
    c.moe.mlp_only_layers = {0};
  } else {
    c.intermediate_size = 12;
    c.num_key_value_heads = 4;
    c.moe.num_experts = 3;
    c.moe.num_experts_per_tok = 2;
  }
  return c;
}

const std::vector<std::string> kModels = {"qwen2_moe", "qwen3_moe", "mixtral"};

class MoeOracleTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    at::set_num_threads(1);
    const Tokenizer tok = Tokenizer::from_alphabet(kAlphabet);
    oracle_ = new testing::TransformersOracle(
        HF_SOURCE_DIR "/tests/model/moe_oracle.py", kModels, tok,
        [&](const std::string& name) { return hybridflow_config(name, tok); }, 41);
  }
  static void TearDownTestSuite() {
    delete oracle_;
    oracle_ = nullptr;
  }
  void SetUp() override {
    const std::string failure = oracle_->failure("tests/model/moe_oracle.py");
    ASSERT_TRUE(failure.empty()) << failure;
  }
  static testing::TransformersOracle* oracle_;
};

testing::TransformersOracle* MoeOracleTest::oracle_ = nullptr;

// Logits and the load-balancing loss of `model` on the reference's inputs, against the reference's.
void expect_same_forward(CausalLM& model, std::map<std::string, torch::Tensor>& ref, const std::string& what) {
  torch::NoGradGuard no_grad;
  model->eval();
  model->set_keep_router_logits(true);
  auto logits = model->forward(ref["input_ids"], ref["attention_mask"]).logits;
  const double aux = model->load_balancing_loss().item<double>();
  model->set_keep_router_logits(false);
  const double diff = max_diff_on_real_tokens(logits, ref["logits"], ref["attention_mask"]);
  const double aux_ref = ref["aux_loss"].item<double>();
  std::printf("%s: max |hybridflow - transformers| logits = %.3g, load-balancing loss %.8f vs %.8f\n", what.c_str(),
              diff, aux, aux_ref);
  EXPECT_LE(diff, kTolerance);
  EXPECT_NEAR(aux, aux_ref, 1e-6);
  EXPECT_GT(ref["logits"].std().item<double>(), 1.0);  // not vacuous
  EXPECT_GT(aux_ref, 0.5);
}

TEST_P(MoeOracleTest, TransformersModelLoadsWithTheSameLogitsAndLoss) {
  const std::string dir = oracle_->reference_dir(GetParam());
  Pretrained loaded = load_pretrained(dir);
  EXPECT_GT(loaded.config.num_moe_layers(), 0);
  auto ref = read_tensors(dir + "/reference.safetensors");
  expect_same_forward(loaded.model, ref, GetParam() + " written by transformers");
}

TEST_P(MoeOracleTest, GreedyGenerationEqualsTransformersGenerate) {
  const std::string dir = oracle_->reference_dir(GetParam());
  Pretrained loaded = load_pretrained(dir);
  auto ref = read_tensors(dir + "/reference.safetensors");
  auto ids = ref["input_ids"], mask = ref["attention_mask"];
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t r = 0; r < ids.size(0); ++r) {
    auto row = ids[r].index({mask[r].to(torch::kBool)}).contiguous();
    prompts.emplace_back(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
  }
  GenerationConfig cfg;
  cfg.greedy = true;
  cfg.max_new_tokens = kMaxNewTokens;
  cfg.eos_token_ids = {kEos};
  cfg.pad_token_id = kPad;
  auto out = generate(loaded.model, prompts, cfg);
  ASSERT_EQ(out.responses.sizes(), ref["generated"].sizes());
  EXPECT_TRUE(torch::equal(out.responses, ref["generated"])) << "hybridflow:\n"
                                                            << out.responses << "\ntransformers:\n"
                                                            << ref["generated"];
}

TEST_P(MoeOracleTest, HybridflowModelLoadsInTransformersWithTheSameLogitsAndLoss) {
  auto ref = read_tensors(oracle_->hybridflow_dir(GetParam()) + "/transformers_logits.safetensors");
  expect_same_forward(oracle_->hybridflow_models.at(GetParam()), ref, GetParam() + " written by hybridflow");
  // And the directory reads back as the config it was written from.
  const ModelConfig back = load_model_config(oracle_->hybridflow_dir(GetParam()) + "/config.json");
  const ModelConfig& original = oracle_->hybridflow_models.at(GetParam())->config();
  EXPECT_EQ(back.moe.num_experts, original.moe.num_experts);
  EXPECT_EQ(back.moe.num_experts_per_tok, original.moe.num_experts_per_tok);
  EXPECT_EQ(back.expert_intermediate_size(), original.expert_intermediate_size());
  EXPECT_EQ(back.moe.shared_expert_intermediate_size, original.moe.shared_expert_intermediate_size);
  EXPECT_EQ(back.moe.norm_topk_prob, original.moe.norm_topk_prob || GetParam() == "mixtral");
  EXPECT_EQ(back.moe.decoder_sparse_step, original.moe.decoder_sparse_step);
  EXPECT_EQ(back.moe.mlp_only_layers, original.moe.mlp_only_layers);
  EXPECT_EQ(back.moe.router_aux_loss_coef, original.moe.router_aux_loss_coef);
  EXPECT_EQ(back.moe.output_router_logits, original.moe.output_router_logits);
  EXPECT_EQ(back.num_moe_layers(), original.num_moe_layers());
}

// A config.json that lacks or mistypes a mixture-of-experts key fails naming it.
TEST_P(MoeOracleTest, MissingOrUnsupportedKeysAreNamed) {
  const std::string path = oracle_->reference_dir(GetParam()) + "/config.json";
  const std::string original = read_file(path);
  auto config_without = [&](const std::string& key, const std::string& replacement) {
    std::string text = original;
    const auto at = text.find("\"" + key + "\"");
    EXPECT_NE(at, std::string::npos) << key;
    const auto end = text.find_first_of(",}", text.find(':', at));
    text.replace(at, end - at + (replacement.empty() && text[end] == ',' ? 1 : 0), replacement);
    testing::TempDir tmp;
    write_file_atomic(tmp.file("config.json"), text);
    try {
      load_model_config(tmp.file("config.json"));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(loaded)");
  };
  const std::string experts = GetParam() == "qwen2_moe" ? "num_experts" : "num_local_experts";
  EXPECT_NE(config_without(experts, "").find("missing required key"), std::string::npos);
  EXPECT_NE(config_without("num_experts_per_tok", "").find("'num_experts_per_tok'"), std::string::npos);
  EXPECT_NE(config_without("num_experts_per_tok", "\"num_experts_per_tok\": 99").find("num_experts_per_tok"),
            std::string::npos);
  if (GetParam() != "mixtral") {
    EXPECT_NE(config_without("moe_intermediate_size", "").find("'moe_intermediate_size'"), std::string::npos);
  }
  if (GetParam() == "qwen2_moe") {
    EXPECT_NE(config_without("shared_expert_intermediate_size", "").find("'shared_expert_intermediate_size'"),
              std::string::npos);
    EXPECT_NE(config_without("mlp_only_layers", "\"mlp_only_layers\": 3").find("'mlp_only_layers'"), std::string::npos);
  }
  if (GetParam() == "mixtral") {
    EXPECT_NE(config_without("router_jitter_noise", "\"router_jitter_noise\": 0.1").find("'router_jitter_noise'"),
              std::string::npos);
  }
}

INSTANTIATE_TEST_SUITE_P(MoeTypes, MoeOracleTest, ::testing::ValuesIn(kModels),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace hybridflow
