#include "hybridflow/model/pretrained.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/model/safetensors.h"
#include "support/temp_dir.h"
#include "support/testdata_dir.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

ModelConfig tiny_config(const Tokenizer& tok) {
  return testing::tiny_model_config(tok, {.hidden_size = 16, .intermediate_size = 24, .max_position_embeddings = 64});
}

class PretrainedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    torch::manual_seed(7);
  }
  // Saves a fresh model of `config` and returns it.
  CausalLM save(const ModelConfig& config) {
    CausalLM model(config);
    save_pretrained(dir.path(), model, tok);
    return model;
  }
  torch::Tensor logits(CausalLM model) {
    torch::Tensor ids = torch::tensor({{1, 4, 5, 6, 7}, {1, 7, 6, 5, 4}}, torch::kInt64);
    torch::NoGradGuard g;
    return model->forward(ids, torch::ones_like(ids)).logits;
  }
  // Rewrites model.safetensors after `edit`.
  void edit_weights(const std::function<void(std::map<std::string, torch::Tensor>&)>& edit) {
    auto file = read_safetensors(dir.file("model.safetensors"));
    std::map<std::string, torch::Tensor> w(file.tensors.begin(), file.tensors.end());
    edit(w);
    write_safetensors(dir.file("model.safetensors"), NamedTensors(w.begin(), w.end()), file.metadata);
  }
  void edit_config(const std::function<void(json&)>& edit) {
    json doc = json::parse(read_file(dir.file("config.json")));
    edit(doc);
    write_file_atomic(dir.file("config.json"), doc.dump());
  }
  // The error loading `good` after `edit` gives (each call starts again from `good`).
  std::string config_error(const json& good, const std::function<void(json&)>& edit) {
    json d = good;
    edit(d);
    write_file_atomic(dir.file("config.json"), d.dump());
    return error_of([&] { load_model_config(dir.file("config.json")); });
  }

  testing::TempDir dir;
  Tokenizer tok = Tokenizer::from_alphabet("abcdefgh");
};

TEST_F(PretrainedTest, RoundTripGivesIdenticalParametersAndLogits) {
  CausalLM model = save(tiny_config(tok));
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"})
    EXPECT_TRUE(file_exists(dir.file(f))) << f;
  Pretrained loaded = load_pretrained(dir.path());
  EXPECT_TRUE(loaded.tokenizer == tok);
  EXPECT_EQ(loaded.config.num_key_value_heads, 2);
  auto a = model->named_parameters(), b = loaded.model->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& item : a) EXPECT_TRUE(torch::equal(item.value(), b[item.key()])) << item.key();
  EXPECT_TRUE(torch::equal(logits(model), logits(loaded.model)));
  auto file = read_safetensors(dir.file("model.safetensors"));
  EXPECT_EQ(file.metadata.at("format"), "pt");
  EXPECT_EQ(file.tensors.size(), a.size());
}

TEST_F(PretrainedTest, HalfPrecisionStorageRoundTripsWithinDtypeTolerance) {
  for (auto [name, st_name, rtol] : {std::tuple<const char*, const char*, double>{"bfloat16", "BF16", 1.0 / 128},
                                     {"float16", "F16", 1.0 / 1024}}) {
    ModelConfig c = tiny_config(tok);
    c.torch_dtype = name;
    CausalLM model = save(c);
    for (const auto& [tname, t] : read_safetensors(dir.file("model.safetensors")).tensors)
      EXPECT_EQ(safetensors_dtype_name(t.scalar_type()), st_name) << tname;
    Pretrained loaded = load_pretrained(dir.path());
    EXPECT_EQ(loaded.config.torch_dtype, name);
    for (const auto& item : model->named_parameters()) {
      torch::Tensor got = loaded.model->named_parameters()[item.key()];
      EXPECT_EQ(got.scalar_type(), torch::kFloat32);
      EXPECT_TRUE(torch::allclose(got, item.value(), rtol, 1e-6)) << name << " " << item.key();
      // Exactly the storage-dtype rounding of the saved value.
      const torch::Dtype storage = safetensors_dtype(st_name);
      EXPECT_TRUE(torch::equal(got, item.value().to(storage).to(torch::kFloat32))) << name << " " << item.key();
    }
    // In-memory dtype is the caller's choice, independent of the storage dtype.
    Pretrained bf = load_pretrained(dir.path(), HeadKind::kLanguageModel, torch::kBFloat16);
    for (const auto& item : bf.model->named_parameters()) EXPECT_EQ(item.value().scalar_type(), torch::kBFloat16);
  }
}

TEST_F(PretrainedTest, LoadsShardedCheckpointThroughIndex) {
  CausalLM model = save(tiny_config(tok));
  auto file = read_safetensors(dir.file("model.safetensors"));
  NamedTensors first, second;
  json weight_map = json::object();
  for (size_t i = 0; i < file.tensors.size(); ++i) {
    const bool in_first = i < file.tensors.size() / 2;
    (in_first ? first : second).push_back(file.tensors[i]);
    weight_map[file.tensors[i].first] =
        in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  write_safetensors(dir.file("model-00001-of-00002.safetensors"), first, {{"format", "pt"}});
  write_safetensors(dir.file("model-00002-of-00002.safetensors"), second, {{"format", "pt"}});
  write_file_atomic(dir.file("model.safetensors.index.json"),
                    json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump());
  std::filesystem::remove(dir.file("model.safetensors"));
  Pretrained loaded = load_pretrained(dir.path());
  EXPECT_TRUE(torch::equal(logits(model), logits(loaded.model)));

  // A shard that does not hold what the index says is an error naming the tensor.
  const std::string moved = first.back().first;
  weight_map[moved] = "model-00002-of-00002.safetensors";
  write_file_atomic(dir.file("model.safetensors.index.json"), json{{"weight_map", weight_map}}.dump());
  std::string err = error_of([&] { load_pretrained(dir.path()); });
  EXPECT_THAT(err, HasSubstr("'" + moved + "'"));
  EXPECT_THAT(err, HasSubstr("model-0000"));
}

TEST_F(PretrainedTest, WeightMismatchesNameEveryTensor) {
  save(tiny_config(tok));
  edit_weights([](auto& w) {
    w.erase("model.layers.1.mlp.up_proj.weight");
    w["model.norm.weight"] = torch::ones({17});
    w["model.layers.9.extra"] = torch::ones({2});
  });
  std::string err = error_of([&] { load_pretrained(dir.path()); });
  EXPECT_THAT(err, HasSubstr(dir.path()));
  EXPECT_THAT(err, HasSubstr("missing [model.layers.1.mlp.up_proj.weight]"));
  EXPECT_THAT(err, HasSubstr("wrong shape [model.norm.weight (file [17], model [16])]"));
  EXPECT_THAT(err, HasSubstr("unexpected [model.layers.9.extra]"));
}

TEST_F(PretrainedTest, ConfigThatDoesNotMatchItsWeightsFailsBeforeBuildingTheModel) {
  save(tiny_config(tok));
  // A million layers over a two-layer file: without the header check first, the model (and its memory) would
  // be built before a weight was compared. The list of missing weights stays short.
  edit_config([](json& c) { c["num_hidden_layers"] = 1000000; });
  std::string err = error_of([&] { load_pretrained(dir.path()); });
  EXPECT_THAT(err, HasSubstr(dir.path() + ": weights do not match config.json: missing [model.layers.2."));
  EXPECT_THAT(err, HasSubstr("config.json implies 9000003 weights (num_hidden_layers 1000000), the files hold"));
  EXPECT_LT(err.size(), 4000u);
  EXPECT_EQ(check_model_directory(dir.path()), std::vector<std::string>{err});

  edit_config([](json& c) {
    c["num_hidden_layers"] = 2;
    c["hidden_size"] = 32;
  });
  err = error_of([&] { load_pretrained(dir.path()); });
  EXPECT_THAT(err, HasSubstr("wrong shape [model.embed_tokens.weight (file [" + std::to_string(tok.vocab_size()) +
                             ", 16], model [" + std::to_string(tok.vocab_size()) + ", 32])"));
}

TEST_F(PretrainedTest, CheckModelDirectoryReportsTruncatedWeights) {
  save(tiny_config(tok));
  EXPECT_EQ(check_model_directory(dir.path()), std::vector<std::string>{});
  const std::string weights = dir.file("model.safetensors");
  std::filesystem::resize_file(weights, std::filesystem::file_size(weights) - 100);
  std::vector<std::string> problems = check_model_directory(dir.path());
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_THAT(problems[0], HasSubstr(weights + ": tensor '"));
  EXPECT_THAT(problems[0], HasSubstr("(file truncated?)"));
  EXPECT_THAT(error_of([&] { load_pretrained(dir.path()); }), HasSubstr("(file truncated?)"));
}

TEST_F(PretrainedTest, TiedQwen2AllowsAbsentOrExtraLmHeadAndIgnoresRotaryBuffers) {
  ModelConfig c = tiny_config(tok);
  c.architecture = "Qwen2ForCausalLM";
  c.model_type = "qwen2";
  c.attention_bias = true;
  c.tie_word_embeddings = true;
  CausalLM model = save(c);
  json cfg = json::parse(read_file(dir.file("config.json")));
  EXPECT_FALSE(cfg.contains("attention_bias"));  // Qwen2Config has no such key
  auto file = read_safetensors(dir.file("model.safetensors"));
  bool has_lm_head = false, has_q_bias = false;
  for (const auto& [name, t] : file.tensors) {
    has_lm_head |= name == "lm_head.weight";
    has_q_bias |= name == "model.layers.0.self_attn.q_proj.bias";
  }
  EXPECT_FALSE(has_lm_head);
  EXPECT_TRUE(has_q_bias);
  Pretrained loaded = load_pretrained(dir.path());
  EXPECT_TRUE(loaded.config.attention_bias);
  EXPECT_TRUE(torch::equal(logits(model), logits(loaded.model)));
  edit_weights([](auto& w) {
    w["lm_head.weight"] = w.at("model.embed_tokens.weight").clone();
    w["model.rotary_emb.inv_freq"] = torch::ones({2});
    w["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch::ones({2});
  });
  EXPECT_TRUE(torch::equal(logits(model), logits(load_pretrained(dir.path()).model)));
}

TEST_F(PretrainedTest, ValueModelFromLanguageModelCheckpointKeepsBackbone) {
  CausalLM model = save(tiny_config(tok));
  Pretrained critic = load_pretrained(dir.path(), HeadKind::kValue);
  for (const auto& item : critic.model->named_parameters()) {
    if (item.key() == "score.weight") continue;
    EXPECT_TRUE(torch::equal(item.value(), model->named_parameters()[item.key()])) << item.key();
  }
}

TEST_F(PretrainedTest, GenerationConfigCarriesSpecialTokenIds) {
  save(tiny_config(tok));
  json gen = json::parse(read_file(dir.file("generation_config.json")));
  EXPECT_EQ(gen["bos_token_id"], tok.bos_id());
  EXPECT_EQ(gen["eos_token_id"], tok.eos_id());
  EXPECT_EQ(gen["pad_token_id"], tok.pad_id());
}

TEST_F(PretrainedTest, ConfigJsonUsesHuggingFaceNamesAndDefaults) {
  ModelConfig c = tiny_config(tok);
  c.rope_theta = 500000.0;
  c.rms_norm_eps = 1e-5;
  save_model_config(c, dir.file("config.json"));
  json doc = json::parse(read_file(dir.file("config.json")));
  EXPECT_EQ(doc["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(doc["model_type"], "llama");
  EXPECT_EQ(doc["num_key_value_heads"], 2);
  EXPECT_EQ(doc["rope_theta"], 500000.0);
  EXPECT_EQ(doc["attention_bias"], false);
  EXPECT_EQ(doc["torch_dtype"], "float32");
  ModelConfig back = load_model_config(dir.file("config.json"));
  EXPECT_EQ(back.rope_theta, 500000.0);
  EXPECT_EQ(back.rms_norm_eps, 1e-5);
  EXPECT_EQ(back.intermediate_size, c.intermediate_size);
  EXPECT_EQ(back.eos_token_id, c.eos_token_id);

  // HF defaults: no num_key_value_heads means one kv head per attention head; eos may be a list.
  edit_config([](json& d) {
    d.erase("num_key_value_heads");
    d["eos_token_id"] = json::array({2, 9});
    d["pad_token_id"] = nullptr;
    d["transformers_version"] = "4.44.0";  // unrelated keys are ignored
  });
  ModelConfig defaults = load_model_config(dir.file("config.json"));
  EXPECT_EQ(defaults.num_key_value_heads, defaults.num_attention_heads);
  EXPECT_EQ(defaults.eos_token_id, 2);
  EXPECT_EQ(defaults.pad_token_id, -1);

  // Qwen2 q/k/v have a bias whatever the file says.
  edit_config([](json& d) {
    d["model_type"] = "qwen2";
    d.erase("attention_bias");
  });
  EXPECT_TRUE(load_model_config(dir.file("config.json")).attention_bias);
}

// transformers 5 writes rope_theta inside rope_parameters and dtype instead of torch_dtype; reading only the
// old names silently gave such models RoPE base 10000 (caught by tests/engine/test_hf_oracle.cpp).
TEST_F(PretrainedTest, ReadsTransformers5ConfigKeys) {
  save_model_config(tiny_config(tok), dir.file("config.json"));
  edit_config([](json& d) {
    d["rope_theta"] = 123.0;  // the nested value wins, as in transformers
    d["rope_parameters"] = {{"rope_theta", 500.0}, {"rope_type", "default"}};
    d.erase("torch_dtype");
    d["dtype"] = "bfloat16";
    d["mlp_bias"] = false;
    d["layer_types"] = {"full_attention", "full_attention"};
  });
  ModelConfig c = load_model_config(dir.file("config.json"));
  EXPECT_EQ(c.rope_theta, 500.0);
  EXPECT_EQ(c.torch_dtype, "bfloat16");

  const json good = json::parse(read_file(dir.file("config.json")));
  auto err = [&](const std::function<void(json&)>& edit) { return config_error(good, edit); };
  EXPECT_THAT(err([](json& d) { d["rope_parameters"]["rope_type"] = "longrope"; }), HasSubstr("\"longrope\""));
  EXPECT_THAT(err([](json& d) { d["rope_parameters"] = {{"full_attention", {{"rope_theta", 1.0}}}}; }),
              HasSubstr("per-layer-type"));
  EXPECT_THAT(err([](json& d) { d["rope_parameters"]["partial_rotary_factor"] = 0.5; }),
              HasSubstr("partial_rotary_factor"));
  EXPECT_THAT(err([](json& d) { d["mlp_bias"] = true; }), HasSubstr("key 'mlp_bias' must be false"));
  EXPECT_THAT(err([](json& d) { d["layer_types"][1] = "sliding_attention"; }), HasSubstr("key 'layer_types'"));
  EXPECT_THAT(err([](json& d) {
                d.erase("layer_types");
                d["use_sliding_window"] = true;
                d["sliding_window"] = 16;
                d["max_window_layers"] = 1;
              }),
              HasSubstr("sliding-window"));
}

// Released checkpoints' keys, as transformers reads them: Llama 3.1's legacy rope_scaling block, Qwen2.5's
// yarn without a factor of its own, Qwen3's implicit head_dim of 128, Mistral's implicit window of 4096.
TEST_F(PretrainedTest, ReadsRopeScalingHeadDimAndSlidingWindow) {
  save_model_config(tiny_config(tok), dir.file("config.json"));
  edit_config([](json& d) {
    d["rope_theta"] = 500000.0;
    d["rope_scaling"] = {{"factor", 8.0},          {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192},
                         {"rope_type", "llama3"}};
  });
  ModelConfig llama31 = load_model_config(dir.file("config.json"));
  EXPECT_EQ(llama31.rope_scaling.type, "llama3");
  EXPECT_EQ(llama31.rope_scaling.factor, 8.0);
  EXPECT_EQ(llama31.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(llama31.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(llama31.rope_theta, 500000.0);

  edit_config([](json& d) {
    d["max_position_embeddings"] = 131072;
    d["rope_scaling"] = {{"type", "yarn"}, {"original_max_position_embeddings", 32768}};
  });
  ModelConfig yarn = load_model_config(dir.file("config.json"));
  EXPECT_EQ(yarn.rope_scaling.type, "yarn");
  EXPECT_EQ(yarn.rope_scaling.factor, 4.0);  // 131072 / 32768
  EXPECT_FALSE(yarn.rope_scaling.attention_factor.has_value());

  edit_config([](json& d) {
    d["model_type"] = "qwen3";
    d.erase("architectures");
    d.erase("head_dim");
    d.erase("rope_scaling");
  });
  ModelConfig qwen3 = load_model_config(dir.file("config.json"));
  EXPECT_EQ(qwen3.architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(qwen3.head_dim(), 128);
  EXPECT_TRUE(qwen3.qk_norm());

  edit_config([](json& d) {
    d["model_type"] = "mistral";
    d["attention_bias"] = true;  // MistralConfig has no such key: ignored, as transformers does
  });
  ModelConfig mistral = load_model_config(dir.file("config.json"));
  EXPECT_EQ(mistral.sliding_window, 4096);
  EXPECT_FALSE(mistral.attention_bias);
  EXPECT_EQ(mistral.head_dim(), mistral.hidden_size / mistral.num_attention_heads);
  edit_config([](json& d) { d["sliding_window"] = nullptr; });
  EXPECT_EQ(load_model_config(dir.file("config.json")).sliding_window, 0);

  // What is written reads back the same.
  for (ModelConfig c : {llama31, yarn, qwen3, mistral}) {
    c.max_position_embeddings = 64;
    c.rope_scaling.original_max_position_embeddings = std::min<int64_t>(c.rope_scaling.original_max_position_embeddings, 32);
    save_model_config(c, dir.file("config.json"));
    ModelConfig back = load_model_config(dir.file("config.json"));
    EXPECT_EQ(back.model_type, c.model_type);
    EXPECT_EQ(back.head_dim(), c.head_dim());
    EXPECT_EQ(back.sliding_window, c.sliding_window);
    EXPECT_EQ(back.rope_scaling.type, c.rope_scaling.type);
    EXPECT_EQ(back.rope_scaling.factor, c.rope_scaling.factor);
    EXPECT_EQ(back.rope_scaling.low_freq_factor, c.rope_scaling.low_freq_factor);
    if (c.rope_scaling.scaled()) {
      EXPECT_EQ(back.rope_scaling.original_max_position_embeddings, c.rope_scaling.original_max_position_embeddings);
    }
  }

  const json good = json::parse(read_file(dir.file("config.json")));
  auto err = [&](const std::function<void(json&)>& edit) { return config_error(good, edit); };
  EXPECT_THAT(err([](json& d) { d["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}}; }),
              HasSubstr("key 'rope_scaling' of rope_type \"llama3\" needs 'low_freq_factor'"));
  EXPECT_THAT(err([](json& d) { d["rope_scaling"] = {{"rope_type", "linear"}, {"factor", "2"}}; }),
              HasSubstr("key 'rope_scaling.factor' must be a number"));
  EXPECT_THAT(err([](json& d) { d["head_dim"] = 7; }), HasSubstr("head_dim must be even"));
  EXPECT_THAT(err([](json& d) { d["sliding_window"] = "4k"; }), HasSubstr("key 'sliding_window' must be an integer"));
}

// A fine-tuned Qwen3 or Llama 3 keeps its generation_config.json (eos list, recommended sampling) through a
// save: a checkpoint that stopped at one eos fewer would run on past the end of its turns.
TEST_F(PretrainedTest, SavingKeepsThePublishedGenerationConfig) {
  const std::string published = testing::tokenizer_data_dir() + "/gpt2";
  ASSERT_TRUE(std::filesystem::exists(published + "/tokenizer.json"))
      << "no published tokenizers; looked in " << testing::tokenizer_data_searched();
  testing::TempDir source;
  std::filesystem::copy_file(published + "/tokenizer.json", source.file("tokenizer.json"));
  const std::string generation = R"({"eos_token_id": [50256, 7], "temperature": 0.6, "top_p": 0.95})";
  write_file_atomic(source.file("generation_config.json"), generation);
  const Tokenizer gpt2 = Tokenizer::load(source.file("tokenizer.json"));
  ModelConfig c = tiny_config(gpt2);
  c.num_hidden_layers = 1;
  CausalLM model(c);
  save_pretrained(dir.path(), model, gpt2);
  EXPECT_EQ(read_file(dir.file("generation_config.json")), generation);
  EXPECT_EQ(generation_stop_ids(dir.path(), -1), (std::vector<int64_t>{50256, 7}));

  // A tokenizer without one: the config's ids, as before.
  save_pretrained(dir.path(), model, tok);
  EXPECT_EQ(json::parse(read_file(dir.file("generation_config.json"))).value("_from_model_config", false), true);
}

TEST_F(PretrainedTest, BadConfigJsonErrorsNameFileAndKey) {
  save(tiny_config(tok));
  const std::string path = dir.file("config.json");
  const json good = json::parse(read_file(path));
  auto err = [&](const std::function<void(json&)>& edit) {
    json d = good;
    edit(d);
    write_file_atomic(path, d.dump());
    std::string e = error_of([&] { load_model_config(path); });
    EXPECT_THAT(e, HasSubstr(path));
    return e;
  };
  EXPECT_THAT(err([](json& d) { d.erase("hidden_size"); }), HasSubstr("missing required key 'hidden_size'"));
  EXPECT_THAT(err([](json& d) { d.erase("model_type"); }), HasSubstr("missing required key 'model_type'"));
  EXPECT_THAT(err([](json& d) { d["vocab_size"] = "12"; }), HasSubstr("key 'vocab_size' must be an integer"));
  EXPECT_THAT(err([](json& d) { d["rms_norm_eps"] = true; }), HasSubstr("key 'rms_norm_eps' must be a number"));
  EXPECT_THAT(err([](json& d) { d["tie_word_embeddings"] = 1; }), HasSubstr("'tie_word_embeddings' must be true"));
  EXPECT_THAT(err([](json& d) { d["model_type"] = "gpt2"; }), HasSubstr("key 'model_type' must be"));
  EXPECT_THAT(err([](json& d) { d["hidden_act"] = "gelu"; }), HasSubstr("key 'hidden_act'"));
  EXPECT_THAT(err([](json& d) { d["rope_scaling"] = {{"type", "linear"}}; }), HasSubstr("key 'rope_scaling'"));
  EXPECT_THAT(err([](json& d) {
                d.erase("head_dim");
                d["num_attention_heads"] = 3;
              }),
              HasSubstr("divisible"));
  write_file_atomic(path, "{\"model_type\": ");
  EXPECT_THAT(error_of([&] { load_model_config(path); }), HasSubstr("not valid JSON"));
  // The whole directory load reports the config problem too.
  write_file_atomic(path, json{{"model_type", "llama"}}.dump());
  EXPECT_THAT(error_of([&] { load_pretrained(dir.path()); }), HasSubstr("missing required key 'vocab_size'"));
}

TEST_F(PretrainedTest, MissingFilesAreNamed) {
  save(tiny_config(tok));
  std::filesystem::remove(dir.file("model.safetensors"));
  EXPECT_THAT(error_of([&] { load_pretrained(dir.path()); }), HasSubstr("no weights"));
  std::filesystem::remove(dir.file("tokenizer.json"));
  EXPECT_THAT(error_of([&] { load_pretrained(dir.path()); }), HasSubstr("tokenizer.json"));
}

}  // namespace
}  // namespace hybridflow
