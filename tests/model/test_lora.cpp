// LoRA adapters (model/lora.h): the branch arithmetic, freezing, the disable switch, merge/unmerge restoring
// the weights bit for bit, target selection, PEFT's files, and Hugging Face PEFT itself as the oracle both
// ways (tests/model/peft_oracle.py, run with the project venv's python).
#include "hybridflow/model/lora.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/model/pipeline_layout.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/model/safetensors.h"
#include "support/python.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

ModelConfig lora_test_config(const std::string& preset = "tiny", int64_t hidden = 32) {
  return testing::tiny_model_config(
      {.vocab_size = 37, .hidden_size = hidden, .intermediate_size = 48, .max_position_embeddings = 64}, preset);
}

LoraConfig lora_config(int64_t rank, double alpha, std::vector<std::string> targets = {"all-linear"}) {
  LoraConfig c;
  c.rank = rank;
  c.alpha = alpha;
  c.target_modules = std::move(targets);
  return c;
}

// Non-zero adapters: a fresh B is zeros, which would hide every mistake in the branch. Unit-variance outputs
// per matrix, as peft_oracle.py draws its adapters.
void randomize_adapters(CausalLM& model, uint64_t seed) {
  torch::manual_seed(seed);
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    auto& p = item.value();
    if (item.key().find(".lora_") != std::string::npos)
      p.copy_(torch::randn(p.sizes()) / std::sqrt(static_cast<double>(p.size(1))));
  }
}

std::set<std::string> adapted_paths(const CausalLM& model) {
  std::set<std::string> paths;
  for (const auto& item : model->named_parameters()) {
    const auto at = item.key().find(".lora_A.");
    if (at != std::string::npos) paths.insert(item.key().substr(0, at));
  }
  return paths;
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

class LoraTest : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    ids_ = torch::randint(0, 37, {2, 6}, torch::kInt64);
    mask_ = torch::ones({2, 6}, torch::kInt64);
    mask_[1][0] = 0;  // one left-padded row
  }
  torch::Tensor logits(CausalLM& model) {
    torch::NoGradGuard no_grad;
    return model->forward(ids_, mask_).logits;
  }
  torch::Tensor ids_, mask_;
};

TEST_F(LoraTest, FreshAdaptersChangeNothingAndOnlyTheyTrain) {
  CausalLM model = testing::seeded_model(lora_test_config(), 3);
  const auto base = logits(model);
  model->add_lora(lora_config(4, 8));
  EXPECT_TRUE(torch::equal(logits(model), base)) << "B starts at zero, so the adapted model is the base model";

  int64_t trainable = 0;
  for (const auto& item : model->named_parameters()) {
    const bool adapter = item.key().find(".lora_") != std::string::npos;
    EXPECT_EQ(item.value().requires_grad(), adapter) << item.key();
    trainable += item.value().requires_grad() ? 1 : 0;
  }
  EXPECT_EQ(trainable, 2 * 7 * 2);  // A and B of 7 projections in 2 layers

  // PEFT's init: A ~ uniform(-1/sqrt(in), 1/sqrt(in)), drawn (not zeros), B zeros.
  auto params = model->named_parameters();
  const auto& a = params["model.layers.0.mlp.down_proj.lora_A.weight"];
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{4, 48}));
  EXPECT_LE(a.abs().max().item<double>(), 1.0 / std::sqrt(48.0));
  EXPECT_GT(a.abs().max().item<double>(), 0.5 / std::sqrt(48.0));
  EXPECT_EQ(params["model.layers.0.mlp.down_proj.lora_B.weight"].sizes(), (std::vector<int64_t>{32, 4}));
  EXPECT_EQ(params["model.layers.0.mlp.down_proj.lora_B.weight"].abs().max().item<double>(), 0.0);

  model->forward(ids_, mask_).logits.pow(2).mean().backward();
  for (const auto& item : model->named_parameters()) {
    if (item.key().find(".lora_") == std::string::npos) {
      EXPECT_FALSE(item.value().grad().defined()) << item.key();
    } else if (item.key().find(".lora_B.") != std::string::npos) {
      ASSERT_TRUE(item.value().grad().defined()) << item.key();
      EXPECT_GT(item.value().grad().abs().max().item<double>(), 0.0) << item.key();
    }
  }
}

TEST_F(LoraTest, BranchIsScaledLowRankUpdate) {
  // The adapted model equals the base model with W + (alpha / r) B A in place of each adapted W.
  CausalLM model = testing::seeded_model(lora_test_config("qwen3-tiny"), 4);
  model->add_lora(lora_config(2, 6, {"q_proj", "down_proj"}));
  randomize_adapters(model, 9);
  const auto adapted = logits(model);

  CausalLM reference = testing::seeded_model(lora_test_config("qwen3-tiny"), 4);
  {
    torch::NoGradGuard no_grad;
    auto params = model->named_parameters();
    auto ref_params = reference->named_parameters();
    for (const auto& path : adapted_paths(model)) {
      auto delta = params[path + ".lora_B.weight"].mm(params[path + ".lora_A.weight"]) * 3.0;
      ref_params[path + ".weight"].add_(delta);
    }
  }
  EXPECT_LT(max_abs_diff(adapted, logits(reference)), 1e-5);
  model->set_lora_enabled(false);
  EXPECT_GT(max_abs_diff(adapted, logits(model)), 1e-3) << "the adapters must matter for the comparison to mean anything";
}

TEST_F(LoraTest, DisableIsTheBaseModelAndMergeUnmergeRestoresBitForBit) {
  CausalLM model = testing::seeded_model(lora_test_config(), 5);
  const auto base = logits(model);
  std::map<std::string, torch::Tensor> before;
  for (const auto& item : model->named_parameters()) before[item.key()] = item.value().detach().clone();
  model->add_lora(lora_config(4, 16));
  randomize_adapters(model, 10);
  const auto adapted = logits(model);
  EXPECT_GT(max_abs_diff(adapted, base), 1e-3);

  model->set_lora_enabled(false);
  EXPECT_TRUE(torch::equal(logits(model), base)) << "disabled adapters leave the base model exactly";
  model->set_lora_enabled(true);
  EXPECT_TRUE(torch::equal(logits(model), adapted));

  for (int cycle = 0; cycle < 3; ++cycle) {
    model->merge_lora();
    EXPECT_TRUE(model->lora_merged());
    EXPECT_LT(max_abs_diff(logits(model), adapted), 1e-5) << "merged weights compute what the branches do";
    EXPECT_FALSE(torch::equal(model->named_parameters()["model.layers.1.self_attn.o_proj.weight"],
                              before["model.layers.1.self_attn.o_proj.weight"]));
    EXPECT_THROW(model->set_lora_enabled(false), Error);
    EXPECT_THROW(model->merge_lora(), Error);
    model->unmerge_lora();
    for (const auto& [name, tensor] : before)
      ASSERT_TRUE(torch::equal(model->named_parameters()[name], tensor)) << name << " after cycle " << cycle;
    EXPECT_TRUE(torch::equal(logits(model), adapted));
  }
  EXPECT_THROW(model->unmerge_lora(), Error);
}

TEST_F(LoraTest, Bfloat16ModelTakesAdaptersInItsDtype) {
  CausalLM model = testing::seeded_model(lora_test_config(), 5);
  model->to(torch::kBFloat16);
  const auto base = logits(model);
  model->add_lora(lora_config(4, 8));
  EXPECT_EQ(model->named_parameters()["model.layers.0.self_attn.q_proj.lora_A.weight"].scalar_type(),
            torch::kBFloat16);
  randomize_adapters(model, 14);
  const auto adapted = logits(model);
  EXPECT_TRUE(torch::isfinite(adapted).all().item<bool>());
  EXPECT_GT(max_abs_diff(adapted, base), 1e-2);
  const auto weight = model->named_parameters()["model.layers.0.mlp.up_proj.weight"].clone();
  model->merge_lora();
  EXPECT_FALSE(torch::equal(model->named_parameters()["model.layers.0.mlp.up_proj.weight"], weight));
  model->unmerge_lora();
  EXPECT_TRUE(torch::equal(model->named_parameters()["model.layers.0.mlp.up_proj.weight"], weight));
  model->set_lora_enabled(false);
  EXPECT_TRUE(torch::equal(logits(model), base));
}

TEST_F(LoraTest, DecodeWithAdaptersEqualsFullForward) {
  // The fused CPU decode kernels know nothing of adapters: a decode step with active branches must not use
  // them, and with merged adapters it may.
  CausalLM model = testing::seeded_model(lora_test_config(), 6);
  model->eval();
  model->add_lora(lora_config(4, 8));
  randomize_adapters(model, 11);
  torch::NoGradGuard no_grad;
  auto sequence = torch::randint(0, 37, {1, 6}, torch::kInt64);
  for (const bool merged : {false, true}) {
    if (merged) model->merge_lora();
    KVCache prefill;
    model->hidden_states(sequence.narrow(1, 0, 5), torch::ones({1, 5}, torch::kInt64), {}, &prefill);
    KVCache cache;
    for (size_t l = 0; l < prefill.keys.size(); ++l) {
      cache.keys.push_back(prefill.keys[l].narrow(2, 0, 5).contiguous());
      cache.values.push_back(prefill.values[l].narrow(2, 0, 5).contiguous());
      cache.keys[l] = torch::cat({cache.keys[l], torch::zeros_like(cache.keys[l])}, 2);
      cache.values[l] = torch::cat({cache.values[l], torch::zeros_like(cache.values[l])}, 2);
    }
    auto step = model->apply_head(model->decode_slots(sequence.narrow(1, 5, 1), {0}, {5}, cache)).logits;
    auto full = model->forward(sequence, torch::ones({1, 6}, torch::kInt64)).logits;
    EXPECT_LT(max_abs_diff(step[0][0], full[0][5]), 1e-4) << (merged ? "merged" : "branches");
  }
  model->unmerge_lora();
}

TEST_F(LoraTest, PipelineStagesDrawTheWholeModelsAdapters) {
  ModelConfig config = lora_test_config();
  config.num_hidden_layers = 4;
  CausalLM whole = testing::seeded_model(config, 2);
  whole->add_lora(lora_config(4, 8), /*seed=*/5);
  auto whole_params = whole->named_parameters();
  size_t covered = 0;
  for (int s = 0; s < 2; ++s) {
    CausalLM stage(config, HeadKind::kLanguageModel, TensorParallelGroup{}, PipelineStage{s, 2});
    stage->add_lora(lora_config(4, 8), /*seed=*/5);
    for (const auto& item : stage->named_parameters()) {
      if (!is_lora_parameter_name(item.key())) continue;
      EXPECT_TRUE(torch::equal(item.value(), whole_params[item.key()])) << item.key() << " on stage " << s;
      // The pipeline layout places an adapter with its projection's layer (checkpoints and weight sync go by it).
      EXPECT_EQ(owning_stage(item.key(), config, 2), s) << item.key();
      EXPECT_TRUE(stage_holds(item.key(), config, HeadKind::kLanguageModel, PipelineStage{s, 2})) << item.key();
      EXPECT_FALSE(stage_holds(item.key(), config, HeadKind::kLanguageModel, PipelineStage{1 - s, 2})) << item.key();
      ++covered;
    }
  }
  EXPECT_EQ(covered, 2u * 7u * 4u);
  // Another seed, other adapters; the same seed without some targets, the same A where targeted.
  CausalLM reseeded = testing::seeded_model(config, 2);
  reseeded->add_lora(lora_config(4, 8), /*seed=*/6);
  const std::string a = "model.layers.2.self_attn.v_proj.lora_A.weight";
  EXPECT_FALSE(torch::equal(reseeded->named_parameters()[a], whole_params[a]));
  CausalLM fewer = testing::seeded_model(config, 2);
  fewer->add_lora(lora_config(4, 8, {"v_proj"}), /*seed=*/5);
  EXPECT_TRUE(torch::equal(fewer->named_parameters()[a], whole_params[a]));
}

TEST_F(LoraTest, TargetsAndExcludesSelectProjections) {
  {
    CausalLM model = testing::seeded_model(lora_test_config(), 1);
    model->add_lora(lora_config(2, 4, {"q_proj", "v_proj"}));
    EXPECT_EQ(adapted_paths(model),
              (std::set<std::string>{"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj",
                                     "model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.v_proj"}));
  }
  {
    CausalLM model = testing::seeded_model(lora_test_config(), 1);
    auto c = lora_config(2, 4);
    c.exclude_modules = {"layers.0.self_attn.q_proj", "down_proj"};
    model->add_lora(c);
    const auto paths = adapted_paths(model);
    EXPECT_EQ(paths.size(), 14u - 3u);
    EXPECT_FALSE(paths.count("model.layers.0.self_attn.q_proj"));
    EXPECT_TRUE(paths.count("model.layers.1.self_attn.q_proj"));
    EXPECT_FALSE(paths.count("model.layers.1.mlp.down_proj"));
  }
  auto expect_error = [](const LoraConfig& c, const std::string& needle) {
    CausalLM model = testing::seeded_model(lora_test_config(), 1);
    try {
      model->add_lora(c);
      ADD_FAILURE() << "no error; expected one naming " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(lora_config(2, 4, {"w_proj"}), "target_modules");
  expect_error(lora_config(2, 4, {"lm_head"}), "target_modules");  // the head is not adapted
  expect_error(lora_config(2, 4, {"all-linear", "q_proj"}), "all-linear");
  expect_error(lora_config(33, 4), "lora_rank");  // wider than hidden_size 32
  expect_error(lora_config(0, 4), "lora_rank");
  auto only_excluded = lora_config(2, 4, {"q_proj"});
  only_excluded.exclude_modules = {"q_proj"};
  expect_error(only_excluded, "exclude_modules");
}

TEST_F(LoraTest, RegularExpressionsMatchWholeModulePaths) {
  auto adapted_by = [](const std::string& target, const std::string& exclude, std::vector<std::string> names = {}) {
    CausalLM model = testing::seeded_model(lora_test_config(), 1);
    auto c = lora_config(2, 4, std::move(names));
    c.target_regex = target;
    c.exclude_regex = exclude;
    model->add_lora(c);
    return adapted_paths(model);
  };
  EXPECT_EQ(adapted_by(R"(.*\.(q|v)_proj)", ""), adapted_by("", "", {"q_proj", "v_proj"}));
  const auto layer0 = adapted_by(R"(model\.layers\.0\..*_proj)", "");
  EXPECT_EQ(layer0.size(), 7u);
  for (const auto& path : layer0) EXPECT_EQ(path.rfind("model.layers.0.", 0), 0u) << path;
  // An exclude expression matching nothing (a VL script's vision tower on a text model) removes nothing.
  EXPECT_EQ(adapted_by("", ".*visual.*", {"all-linear"}).size(), 14u);
  EXPECT_EQ(adapted_by("", R"(.*mlp\..*)", {"all-linear"}),
            adapted_by("", "", {"q_proj", "k_proj", "v_proj", "o_proj"}));
  // Lookahead, as verl's VL LoRA examples write to keep the vision tower out.
  EXPECT_EQ(adapted_by(R"(^(?!.*mlp).*_proj$)", ""), adapted_by("", "", {"q_proj", "k_proj", "v_proj", "o_proj"}));

  auto error_of = [](const std::string& target) {
    CausalLM model = testing::seeded_model(lora_test_config(), 1);
    auto c = lora_config(2, 4, {});
    c.target_regex = target;
    try {
      model->add_lora(c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // A bare name is an expression over whole paths, as in PEFT: it matches none.
  EXPECT_THAT(error_of("q_proj"), ::testing::HasSubstr("matches the whole path of no projection"));
  EXPECT_THAT(error_of(".*"), ::testing::HasSubstr("model.embed_tokens, which hybridflow does not adapt"));
  // PEFT refuses a norm too ("not supported"); a layer's whole subtree takes its norms.
  EXPECT_THAT(error_of(R"(model\.layers\.0\..*)"),
              ::testing::HasSubstr("model.layers.0.input_layernorm, which hybridflow does not adapt"));
  EXPECT_THAT(error_of("(q_proj"), ::testing::HasSubstr("is not a regular expression"));
}

// A mixture-of-experts model takes adapters on its attention projections (every layer's) and its dense layers'
// MLPs; its experts, routers and shared experts take none, so all-linear and names or expressions that reach them
// are errors naming the key (PEFT would adapt them: a silently smaller adapter would be another run).
TEST_F(LoraTest, MixtureOfExpertsModelsTakeAdaptersOnTheirDenseProjectionsOnly) {
  const ModelConfig moe = lora_test_config("qwen3-moe-tiny");
  ASSERT_EQ(moe.num_moe_layers(), 1);  // layer 1 sparse, layer 0 dense
  CausalLM model = testing::seeded_model(moe, 1);
  const auto base = logits(model);
  model->add_lora(lora_config(2, 4, {"q_proj", "v_proj", "layers.0.mlp.up_proj"}));
  EXPECT_EQ(adapted_paths(model),
            (std::set<std::string>{"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj",
                                   "model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.v_proj",
                                   "model.layers.0.mlp.up_proj"}));
  randomize_adapters(model, 5);
  const auto adapted = logits(model);
  EXPECT_GT(max_abs_diff(adapted, base), 1e-3) << "the adapters must matter";
  model->set_lora_enabled(false);
  EXPECT_TRUE(torch::equal(logits(model), base));
  model->set_lora_enabled(true);
  model->merge_lora();
  EXPECT_LT(max_abs_diff(logits(model), adapted), 1e-5) << "merged weights compute what the branches do";
  model->unmerge_lora();
  EXPECT_TRUE(torch::equal(logits(model), adapted));

  auto error_of = [&](LoraConfig c) {
    CausalLM fresh = testing::seeded_model(moe, 1);
    try {
      fresh->add_lora(c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(error_of(lora_config(2, 4)), ::testing::HasSubstr("all-linear on a mixture-of-experts model"));
  EXPECT_THAT(error_of(lora_config(2, 4, {"q_proj", "gate_proj"})),
              ::testing::HasSubstr("'gate_proj' matches model.layers.1.mlp.experts.0.gate_proj of a mixture-of-experts layer"));
  auto experts = lora_config(2, 4, {});
  experts.target_regex = R"(.*\.experts\..*)";
  EXPECT_THAT(error_of(experts), ::testing::HasSubstr("which hybridflow does not adapt"));
}

// adapter_config.json keeps targets as given, so loading the file adapts the same modules again; resolving a
// layer-qualified name to its last part would adapt that projection in every layer.
TEST_F(LoraTest, SavedTargetsAreTheGivenOnesAndLoadBackToTheSameModules) {
  auto regex = lora_config(2, 4, {});
  regex.target_regex = R"(model\.layers\.1\.self_attn\..*)";
  regex.exclude_regex = R"(.*o_proj)";
  for (const LoraConfig& c : {lora_config(2, 4, {"layers.0.self_attn.q_proj", "up_proj"}), regex}) {
    testing::TempDir dir;
    CausalLM model = testing::seeded_model(lora_test_config(), 7);
    model->add_lora(c);
    randomize_adapters(model, 3);
    save_lora_adapter(dir.path(), model, "base");
    const auto config = nlohmann::json::parse(read_file(dir.file("adapter_config.json")));
    if (c.target_regex.empty()) {
      EXPECT_EQ(config["target_modules"], nlohmann::json(c.target_modules));
      EXPECT_TRUE(config["exclude_modules"].is_null());
    } else {
      EXPECT_EQ(config["target_modules"], c.target_regex);
      EXPECT_EQ(config["exclude_modules"], c.exclude_regex);
    }
    CausalLM loaded = testing::seeded_model(lora_test_config(), 7);
    load_lora_adapter(dir.path(), loaded);
    EXPECT_EQ(adapted_paths(loaded), adapted_paths(model));
    EXPECT_TRUE(torch::equal(logits(loaded), logits(model)));
  }
}

TEST_F(LoraTest, SavesPeftFilesAndLoadsThemBack) {
  testing::TempDir dir;
  CausalLM model = testing::seeded_model(lora_test_config(), 7);
  model->add_lora(lora_config(4, 8));
  randomize_adapters(model, 12);
  const auto adapted = logits(model);
  save_lora_adapter(dir.path(), model, "some/base-model");

  auto file = read_safetensors(dir.file("adapter_model.safetensors"));
  EXPECT_EQ(file.tensors.size(), 28u);
  std::set<std::string> names;
  for (const auto& [name, t] : file.tensors) names.insert(name);
  EXPECT_TRUE(names.count("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
  EXPECT_TRUE(names.count("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));
  auto config = nlohmann::json::parse(read_file(dir.file("adapter_config.json")));
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["task_type"], "CAUSAL_LM");
  EXPECT_EQ(config["r"], 4);
  EXPECT_EQ(config["lora_alpha"], 8.0);
  EXPECT_EQ(config["base_model_name_or_path"], "some/base-model");
  EXPECT_EQ(config["target_modules"],
            nlohmann::json({"down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"}));

  CausalLM loaded = testing::seeded_model(lora_test_config(), 7);
  load_lora_adapter(dir.path(), loaded);
  EXPECT_TRUE(torch::equal(logits(loaded), adapted));

  // An adapter for another base model: shapes disagree, the error names the file and the tensor.
  CausalLM wider = testing::seeded_model(lora_test_config("tiny", 48), 7);
  try {
    load_lora_adapter(dir.path(), wider);
    ADD_FAILURE() << "an adapter of a 32-wide model loaded into a 48-wide one";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("adapter_model.safetensors"), std::string::npos) << e.what();
  }
  // PEFT options hybridflow does not implement are errors naming the key.
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"use_dora", true}, {"use_rslora", true}, {"bias", "all"}, {"rank_pattern", {{"q_proj", 8}}}}) {
    auto changed = config;
    changed[key] = value;
    write_file_atomic(dir.file("adapter_config.json"), changed.dump());
    CausalLM fresh = testing::seeded_model(lora_test_config(), 7);
    try {
      load_lora_adapter(dir.path(), fresh);
      ADD_FAILURE() << key << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
}

TEST_F(LoraTest, SavePretrainedWritesTheBaseOrTheMergedModel) {
  // Adapter tensors never enter model.safetensors: unmerged, the directory is the base model; merged, it is a
  // plain model computing what base + adapters compute.
  testing::TempDir dir;
  Tokenizer tok = Tokenizer::from_alphabet("0123456789+=abcdefghijklmnopqrstuvwxy");
  ModelConfig config = testing::tiny_model_config(tok, {.hidden_size = 32, .intermediate_size = 48,
                                                         .max_position_embeddings = 64});
  CausalLM model = testing::seeded_model(config, 8);
  const auto base = logits(model);
  model->add_lora(lora_config(4, 8, {"v_proj", "up_proj"}));
  randomize_adapters(model, 13);
  const auto adapted = logits(model);

  save_pretrained(dir.file("base"), model, tok);
  Pretrained saved_base = load_pretrained(dir.file("base"));
  EXPECT_FALSE(saved_base.model->has_lora());
  EXPECT_TRUE(torch::equal(logits(saved_base.model), base));

  model->merge_lora();
  save_pretrained(dir.file("merged"), model, tok);
  model->unmerge_lora();
  Pretrained merged = load_pretrained(dir.file("merged"));
  EXPECT_LT(max_abs_diff(logits(merged.model), adapted), 1e-5);
  EXPECT_GT(max_abs_diff(logits(merged.model), base), 1e-3);
}

// PEFT as the oracle, both ways, on Llama and Qwen3 with all-linear adapters and on Qwen3-MoE with adapters on its
// attention.
class PeftOracleTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    at::set_num_threads(1);
    dir_ = new testing::TempDir();
    python_ = testing::python_for_tests();
    write_ = testing::run_shell("HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 " + testing::shell_quote(python_) + " " +
                                testing::shell_quote(HF_SOURCE_DIR "/tests/model/peft_oracle.py") + " write " +
                                testing::shell_quote(dir_->path()));
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    ASSERT_EQ(write_.exit_code, 0) << "tests/model/peft_oracle.py with " << python_
                                   << " failed (run scripts/setup.sh: it installs torch, transformers and peft into "
                                      ".venv, or set HF_PYTHON):\n"
                                   << write_.output;
  }
  static std::map<std::string, torch::Tensor> tensors(const std::string& path) {
    auto file = read_safetensors(path);
    return {file.tensors.begin(), file.tensors.end()};
  }
  static double diff_on_real_tokens(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& mask) {
    auto real = mask.to(torch::kBool);
    return (a.index({real}) - b.index({real})).abs().max().item<double>();
  }
  std::string model_dir(const std::string& part) const { return dir_->file(GetParam() + "/" + part); }
  // A mixture-of-experts model's adapters go on its attention (hybridflow adapts no expert yet); the others' on
  // every projection.
  bool mixture_of_experts() const { return GetParam() == "qwen3_moe"; }
  std::vector<std::string> oracle_targets() const {
    if (mixture_of_experts()) return {"q_proj", "k_proj", "v_proj", "o_proj"};
    return {"all-linear"};
  }
  void expect_peft_reads_hybridflow_adapter(const LoraConfig& lora, const std::string& name);
  static testing::TempDir* dir_;
  static std::string python_;
  static testing::CommandResult write_;
};

testing::TempDir* PeftOracleTest::dir_ = nullptr;
std::string PeftOracleTest::python_;
testing::CommandResult PeftOracleTest::write_;

// fp32: 1e-5 of the largest logit. These models' logits reach ~17, where the base model alone (adapters off in
// both) already differs by ~1e-5 in absolute terms between the two implementations (a few float32 ulps); the
// adapters add no error of their own above that (both printed).
constexpr double kPeftRelativeTolerance = 1e-5;

double peft_tolerance(const torch::Tensor& reference_logits) {
  return kPeftRelativeTolerance * std::max(1.0, reference_logits.abs().max().item<double>());
}

TEST_P(PeftOracleTest, PeftAdapterLoadsWithTheSameLogits) {
  Pretrained base = load_pretrained(model_dir("base"));
  load_lora_adapter(model_dir("peft_adapter"), base.model);
  auto ref = tensors(model_dir("peft_adapter/reference.safetensors"));
  base.model->eval();
  torch::NoGradGuard no_grad;
  auto logits = base.model->forward(ref["input_ids"], ref["attention_mask"]).logits;
  const double diff = diff_on_real_tokens(logits, ref["logits"], ref["attention_mask"]);
  EXPECT_LT(diff, peft_tolerance(ref["logits"]));
  base.model->set_lora_enabled(false);
  auto base_logits = base.model->forward(ref["input_ids"], ref["attention_mask"]).logits;
  std::printf("%s + adapter written by peft: max |hybridflow - peft| = %.3g (adapters off in both: %.3g), max |logit| "
              "%.3g\n",
              GetParam().c_str(), diff, diff_on_real_tokens(base_logits, ref["base_logits"], ref["attention_mask"]),
              ref["logits"].abs().max().item<double>());
  EXPECT_GT(diff_on_real_tokens(base_logits, ref["logits"], ref["attention_mask"]), 1e-2)
      << "the adapter must matter for this comparison to mean anything";
}

// Saves adapters `lora` selects on the base model, has PEFT load them, and compares logits and the adapted modules.
void PeftOracleTest::expect_peft_reads_hybridflow_adapter(const LoraConfig& lora, const std::string& name) {
  Pretrained base = load_pretrained(model_dir("base"));
  base.model->add_lora(lora);
  randomize_adapters(base.model, 21);
  const std::string adapter = model_dir(name);
  save_lora_adapter(adapter, base.model, model_dir("base"));
  const std::string out = model_dir(name + "_peft_logits.safetensors");
  auto run = testing::run_shell("HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 " + testing::shell_quote(python_) + " " +
                                testing::shell_quote(HF_SOURCE_DIR "/tests/model/peft_oracle.py") + " score " +
                                testing::shell_quote(model_dir("base")) + " " + testing::shell_quote(adapter) + " " +
                                testing::shell_quote(out));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  // PEFT gives a module it targets but finds no tensors for a zero B, which the logits would not show.
  const auto peft_modules = nlohmann::json::parse(read_file(out + ".modules.json")).get<std::set<std::string>>();
  EXPECT_EQ(peft_modules, adapted_paths(base.model)) << "PEFT adapted other modules than hybridflow";
  auto ref = tensors(out);
  base.model->eval();
  torch::NoGradGuard no_grad;
  auto logits = base.model->forward(ref["input_ids"], ref["attention_mask"]).logits;
  const double diff = diff_on_real_tokens(logits, ref["logits"], ref["attention_mask"]);
  base.model->set_lora_enabled(false);
  auto base_logits = base.model->forward(ref["input_ids"], ref["attention_mask"]).logits;
  std::printf("%s + %s written by hybridflow, scored by peft: max |hybridflow - peft| = %.3g (adapters off in "
              "both: %.3g), max |logit| %.3g\n",
              GetParam().c_str(), name.c_str(), diff,
              diff_on_real_tokens(base_logits, ref["base_logits"], ref["attention_mask"]),
              ref["logits"].abs().max().item<double>());
  EXPECT_LT(diff, peft_tolerance(ref["logits"]));
  EXPECT_GT(diff_on_real_tokens(base_logits, ref["logits"], ref["attention_mask"]), 1e-2)
      << "the adapter must matter for this comparison to mean anything";
}

TEST_P(PeftOracleTest, HybridflowAdapterLoadsInPeftWithTheSameLogits) {
  expect_peft_reads_hybridflow_adapter(lora_config(4, 12, oracle_targets()), "hybridflow_adapter");
}

// Targets as a regular expression and as a layer-qualified name, excludes as an expression: the saved
// adapter_config.json keeps them as given, and PEFT selects exactly the modules hybridflow adapted.
TEST_P(PeftOracleTest, RegularExpressionAndPathTargetsSelectTheSameModulesInPeft) {
  // PEFT under transformers 5 rewrites a mixture-of-experts model's targets for its fused experts
  // (peft/utils/transformers_weight_conversion.py: up_proj only with gate_proj, expressions re-targeted), so
  // there only the attention names of the test above carry over as written.
  if (mixture_of_experts()) GTEST_SKIP() << "PEFT rewrites mixture-of-experts targets (transformers 5 conversion)";
  auto by_regex = lora_config(4, 12, {});
  by_regex.target_regex = R"(model\.layers\.0\..*_proj)";
  by_regex.exclude_regex = R"(.*\.(k_proj|down_proj))";
  expect_peft_reads_hybridflow_adapter(by_regex, "regex_adapter");
  expect_peft_reads_hybridflow_adapter(lora_config(4, 12, {"layers.1.self_attn.v_proj", "up_proj"}), "path_adapter");
}

TEST_P(PeftOracleTest, MergedDirectoryIsPeftsMergeAndUnload) {
  // `hybridflow lora merge` on PEFT's adapter: a plain model directory computing base + adapter, which
  // transformers loads alone and which gives the logits of PEFT's own merge_and_unload().
  const std::string merged_dir = model_dir("merged");
  write_merged_lora_model(model_dir("base"), model_dir("peft_adapter"), merged_dir);
  EXPECT_EQ(read_file(merged_dir + "/config.json"), read_file(model_dir("base/config.json")));
  EXPECT_EQ(read_file(merged_dir + "/tokenizer.json"), read_file(model_dir("base/tokenizer.json")));
  const auto merged_weights = tensors(merged_dir + "/model.safetensors");
  const auto base_weights = tensors(model_dir("base/model.safetensors"));
  std::set<std::string> merged_names, base_names;
  for (const auto& [name, t] : merged_weights) merged_names.insert(name);
  for (const auto& [name, t] : base_weights) base_names.insert(name);
  EXPECT_EQ(merged_names, base_names) << "Hugging Face's names, no adapter tensors";

  const std::string out = model_dir("merged_logits.safetensors");
  auto run = testing::run_shell("HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 " + testing::shell_quote(python_) + " " +
                                testing::shell_quote(HF_SOURCE_DIR "/tests/model/peft_oracle.py") + " merge " +
                                testing::shell_quote(model_dir("base")) + " " +
                                testing::shell_quote(model_dir("peft_adapter")) + " " +
                                testing::shell_quote(merged_dir) + " " + testing::shell_quote(out));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  auto ref = tensors(out);
  const auto& mask = ref["attention_mask"];
  const double transformers_vs_peft = diff_on_real_tokens(ref["logits"], ref["peft_merged_logits"], mask);
  EXPECT_LT(transformers_vs_peft, peft_tolerance(ref["peft_merged_logits"]));

  torch::NoGradGuard no_grad;
  Pretrained merged = load_pretrained(merged_dir);
  EXPECT_FALSE(merged.model->has_lora());
  merged.model->eval();
  auto merged_logits = merged.model->forward(ref["input_ids"], mask).logits;
  Pretrained adapted = load_pretrained(model_dir("base"));
  load_lora_adapter(model_dir("peft_adapter"), adapted.model);
  adapted.model->eval();
  auto adapted_logits = adapted.model->forward(ref["input_ids"], mask).logits;
  const double merged_vs_branches = diff_on_real_tokens(merged_logits, adapted_logits, mask);
  const double merged_vs_transformers = diff_on_real_tokens(merged_logits, ref["logits"], mask);
  std::printf("%s merged by hybridflow: max |merged - base + adapter| = %.3g in hybridflow, max |hybridflow - "
              "transformers| on the merged directory = %.3g, max |transformers on it - peft merge_and_unload| = %.3g\n",
              GetParam().c_str(), merged_vs_branches, merged_vs_transformers, transformers_vs_peft);
  EXPECT_LT(merged_vs_branches, peft_tolerance(adapted_logits));
  EXPECT_LT(merged_vs_transformers, peft_tolerance(ref["logits"]));
  adapted.model->set_lora_enabled(false);
  EXPECT_GT(diff_on_real_tokens(merged_logits, adapted.model->forward(ref["input_ids"], mask).logits, mask), 1e-2)
      << "the adapter must matter for this comparison to mean anything";
}

INSTANTIATE_TEST_SUITE_P(LlamaQwen3AndQwen3Moe, PeftOracleTest, ::testing::Values("llama", "qwen3", "qwen3_moe"));

}  // namespace
}  // namespace hybridflow
