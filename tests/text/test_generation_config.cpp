// generation_config.json reading: the forms Hugging Face models ship (one eos id or a list), absent
// and null keys, and malformed keys, whose errors must name the file and the key.
#include <gtest/gtest.h>

#include <fstream>

#include "hybridflow/core/error.h"
#include "hybridflow/text/generation_config.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

namespace hybridflow::text {
namespace {

using json = nlohmann::ordered_json;
using testing::error_of;

TEST(GenerationDefaults, ReadsAFileWithAnEosList) {
  testing::TempDir dir;
  // As Llama 3 instruct ships it.
  std::ofstream(dir.file("generation_config.json")) << R"({
    "bos_token_id": 128000, "do_sample": true, "eos_token_id": [128001, 128008, 128009],
    "temperature": 0.6, "top_p": 0.9, "top_k": 50, "max_new_tokens": 256, "max_length": 4096,
    "transformers_version": "4.45.0"})";
  GenerationDefaults g = GenerationDefaults::load(dir.file("generation_config.json"));
  EXPECT_EQ(g.eos_token_ids, (std::vector<std::int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(g.bos_token_id, 128000);
  EXPECT_EQ(g.pad_token_id, std::nullopt);
  EXPECT_EQ(g.do_sample, true);
  EXPECT_DOUBLE_EQ(*g.temperature, 0.6);
  EXPECT_DOUBLE_EQ(*g.top_p, 0.9);
  EXPECT_EQ(g.top_k, 50);
  EXPECT_EQ(g.max_new_tokens, 256);
  EXPECT_EQ(g.max_length, 4096);
}

TEST(GenerationDefaults, SingleEosAbsentAndNullKeys) {
  GenerationDefaults g = GenerationDefaults::from_json(
      json::parse(R"({"eos_token_id": 151645, "pad_token_id": 151643, "temperature": 1, "top_k": null})"), "g.json");
  EXPECT_EQ(g.eos_token_ids, (std::vector<std::int64_t>{151645}));
  EXPECT_EQ(g.pad_token_id, 151643);
  EXPECT_DOUBLE_EQ(*g.temperature, 1.0);  // an integer is a valid temperature
  EXPECT_EQ(g.top_k, std::nullopt);
  EXPECT_EQ(g.do_sample, std::nullopt);
  EXPECT_EQ(g.max_new_tokens, std::nullopt);
  GenerationDefaults empty = GenerationDefaults::from_json(json::object(), "g.json");
  EXPECT_TRUE(empty.eos_token_ids.empty());
}

TEST(GenerationDefaults, MalformedKeysNameFileAndKey) {
  for (const auto& [text, key] : std::vector<std::pair<std::string, std::string>>{
           {R"({"eos_token_id": "2"})", "'eos_token_id'"},
           {R"({"eos_token_id": [1, "x"]})", "'eos_token_id'"},
           {R"({"eos_token_id": -1})", "'eos_token_id'"},
           {R"({"bos_token_id": 1.5})", "'bos_token_id'"},
           {R"({"pad_token_id": true})", "'pad_token_id'"},
           {R"({"do_sample": 1})", "'do_sample'"},
           {R"({"temperature": "hot"})", "'temperature'"},
           {R"({"top_p": 1.5})", "'top_p'"},
           {R"({"top_k": -3})", "'top_k'"},
           {R"({"max_new_tokens": 0})", "'max_new_tokens'"},
           {R"({"max_length": 2.0})", "'max_length'"}}) {
    const std::string e =
        error_of([&] { GenerationDefaults::from_json(json::parse(text), "/m/generation_config.json"); });
    EXPECT_NE(e.find("/m/generation_config.json"), std::string::npos) << text << " -> " << e;
    EXPECT_NE(e.find(key), std::string::npos) << text << " -> " << e;
  }
  testing::TempDir dir;
  std::ofstream(dir.file("bad.json")) << "{";
  EXPECT_NE(error_of([&] { GenerationDefaults::load(dir.file("bad.json")); }).find("bad.json"), std::string::npos);
  EXPECT_NE(error_of([&] { GenerationDefaults::load(dir.file("none.json")); }).find("none.json"), std::string::npos);
}

}  // namespace
}  // namespace hybridflow::text
