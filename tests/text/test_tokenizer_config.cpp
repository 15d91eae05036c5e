// tokenizer_config.json reading: files written by the test in each form transformers accepts, and
// malformed keys, whose errors must name the file and the key.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "hybridflow/core/error.h"
#include "hybridflow/text/tokenizer_config.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "text/chat_template_oracle.h"

namespace hybridflow::text {
namespace {

using json = nlohmann::ordered_json;
using testing::error_of;

std::string write(const testing::TempDir& dir, const std::string& name, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(dir.file(name)).parent_path());
  std::ofstream(dir.file(name), std::ios::binary) << text;
  return dir.file(name);
}

TEST(TokenizerConfig, ReadsStringTemplateTokensAndFlags) {
  testing::TempDir dir;
  const std::string path = write(dir, "tokenizer_config.json", R"({
    "chat_template": "{{ bos_token }}{{ messages[0].content }}",
    "bos_token": "<s>", "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": false},
    "pad_token": null, "unk_token": "<unk>", "add_bos_token": true, "add_eos_token": false,
    "model_max_length": 4096, "tokenizer_class": "LlamaTokenizer", "added_tokens_decoder": {}})");
  TokenizerConfig c = TokenizerConfig::load(path);
  EXPECT_EQ(c.chat_template, "{{ bos_token }}{{ messages[0].content }}");
  EXPECT_TRUE(c.named_chat_templates.empty());
  EXPECT_EQ(c.bos_token, "<s>");
  EXPECT_EQ(c.eos_token, "</s>");
  EXPECT_EQ(c.pad_token, std::nullopt);
  EXPECT_EQ(c.unk_token, "<unk>");
  EXPECT_EQ(c.add_bos_token, true);
  EXPECT_EQ(c.add_eos_token, false);
  EXPECT_EQ(c.model_max_length, 4096);
  EXPECT_EQ(c.special_token_variables(), json({{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}}));
  EXPECT_EQ(c.template_for(false), *c.chat_template);
  EXPECT_EQ(c.template_for(true), *c.chat_template);
}

TEST(TokenizerConfig, ListFormPicksDefaultAndToolUse) {
  TokenizerConfig c = TokenizerConfig::from_json(
      json::parse(R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"},
                                         {"name": "rag", "template": "R"}]})"),
      "cfg.json");
  EXPECT_EQ(c.chat_template, "D");
  EXPECT_EQ(c.named_chat_templates.size(), 3u);
  EXPECT_EQ(c.named_chat_templates.at("rag"), "R");
  EXPECT_EQ(c.template_for(false), "D");
  EXPECT_EQ(c.template_for(true), "T");
  TokenizerConfig no_default =
      TokenizerConfig::from_json(json::parse(R"({"chat_template": [{"name": "rag", "template": "R"}]})"), "cfg.json");
  EXPECT_EQ(no_default.chat_template, std::nullopt);
  EXPECT_NE(error_of([&] { no_default.template_for(false); }).find("default"), std::string::npos);
}

TEST(TokenizerConfig, NoTemplateAndNoLimit) {
  // transformers writes "no limit" as int(1e30), more than any int64.
  TokenizerConfig c = TokenizerConfig::from_json(json::parse(R"({"model_max_length": 1000000000000000019884624838656})"), "cfg.json");
  EXPECT_EQ(c.model_max_length, std::nullopt);
  EXPECT_EQ(c.chat_template, std::nullopt);
  const std::string e = error_of([&] { c.template_for(false); });
  EXPECT_NE(e.find("cfg.json"), std::string::npos) << e;
  EXPECT_NE(e.find("no chat_template"), std::string::npos) << e;
}

TEST(TokenizerConfig, ChatTemplateJinjaFileReplacesTheConfigsTemplate) {
  testing::TempDir dir;
  const std::string path = write(dir, "m/tokenizer_config.json", R"({"chat_template": "old"})");
  write(dir, "m/chat_template.jinja", "new {{ x }}");
  EXPECT_EQ(TokenizerConfig::load(path).chat_template, "new {{ x }}");
}

TEST(TokenizerConfig, MalformedKeysNameFileAndKey) {
  auto error_for = [](const std::string& text) {
    return error_of([&] { TokenizerConfig::from_json(json::parse(text), "/models/x/tokenizer_config.json"); });
  };
  for (const auto& [text, key] : std::vector<std::pair<std::string, std::string>>{
           {R"({"eos_token": 7})", "'eos_token'"},
           {R"({"bos_token": {"id": 1}})", "'bos_token'"},
           {R"({"chat_template": 3})", "'chat_template'"},
           {R"({"chat_template": [{"name": "default"}]})", "'chat_template[0]'"},
           {R"({"add_bos_token": "yes"})", "'add_bos_token'"},
           {R"({"model_max_length": "big"})", "'model_max_length'"},
           {R"({"model_max_length": -1})", "'model_max_length'"}}) {
    const std::string e = error_for(text);
    EXPECT_NE(e.find("/models/x/tokenizer_config.json"), std::string::npos) << text << " -> " << e;
    EXPECT_NE(e.find(key), std::string::npos) << text << " -> " << e;
  }
  EXPECT_NE(error_for("[1]").find("expected a JSON object"), std::string::npos);
  testing::TempDir dir;
  const std::string bad = write(dir, "tokenizer_config.json", "{not json");
  EXPECT_NE(error_of([&] { TokenizerConfig::load(bad); }).find(bad), std::string::npos);
  EXPECT_NE(error_of([&] { TokenizerConfig::load(dir.file("absent.json")); }).find("absent.json"), std::string::npos);
}

TEST(TokenizerConfig, ReadsTheSharedRealConfigs) {
  const std::string root = testing::tokenizer_data_dir() + "/";
  if (!std::filesystem::exists(root + "qwen3/tokenizer_config.json")) GTEST_SKIP() << "no test data at " << root;
  TokenizerConfig qwen = TokenizerConfig::load(root + "qwen3/tokenizer_config.json");
  EXPECT_TRUE(qwen.chat_template.has_value());
  EXPECT_EQ(qwen.eos_token, "<|im_end|>");
  EXPECT_EQ(qwen.bos_token, std::nullopt);
  EXPECT_EQ(qwen.pad_token, "<|endoftext|>");
  EXPECT_EQ(qwen.add_bos_token, false);
  EXPECT_EQ(qwen.model_max_length, 131072);
  TokenizerConfig llama = TokenizerConfig::load(root + "llama3/tokenizer_config.json");
  EXPECT_EQ(llama.bos_token, "<|begin_of_text|>");
  EXPECT_EQ(llama.model_max_length, std::nullopt);
  TokenizerConfig gpt2 = TokenizerConfig::load(root + "gpt2/tokenizer_config.json");
  EXPECT_EQ(gpt2.chat_template, std::nullopt);
}

}  // namespace
}  // namespace hybridflow::text
