// `hybridflow tokenize` as a user runs it: the ids of a published tokenizer (the text layer's, which
// tests/text checks against the Python tokenizers library), JSON output, and its errors.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hybridflow/core/fs.h"
#include "hybridflow/text/tokenizer.h"
#include "support/python.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/testdata_dir.h"

namespace {

using hybridflow::testing::CommandResult;
using hybridflow::testing::run_hybridflow;

std::string spm_dir() { return hybridflow::testing::tokenizer_data_dir() + "/spm-bpe-32k"; }

TEST(CliTokenize, JsonHasTheTextLayersIdsWithAndWithoutSpecialTokens) {
  if (!hybridflow::file_exists(spm_dir() + "/tokenizer.json")) GTEST_SKIP() << "not found: " << spm_dir();
  const std::string text = "Hello  wörld 👋";
  hybridflow::testing::TempDir dir;
  hybridflow::write_file_atomic(dir.file("in.txt"), text);
  const auto tok = hybridflow::text::Tokenizer::from_file(spm_dir() + "/tokenizer.json");
  for (bool special : {true, false}) {
    CommandResult r = run_hybridflow("tokenize --tokenizer " + spm_dir() + " --file " + dir.file("in.txt") + " --json" +
                                     (special ? "" : " --no-special"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const nlohmann::json out = nlohmann::json::parse(r.output);
    EXPECT_EQ(out["text"], text);
    const std::vector<int32_t> expected = tok.encode(text, special);
    EXPECT_EQ(out["ids"].get<std::vector<int32_t>>(), expected);
    EXPECT_EQ(out["tokens"].get<std::vector<std::string>>(), tok.tokens(expected));
  }
}

TEST(CliTokenize, PlainOutputListsEachToken) {
  if (!hybridflow::file_exists(spm_dir() + "/tokenizer.json")) GTEST_SKIP() << "not found: " << spm_dir();
  CommandResult r = run_hybridflow("tokenize --tokenizer " + spm_dir() + " 'Hi there'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto tok = hybridflow::text::Tokenizer::from_file(spm_dir() + "/tokenizer.json");
  const std::vector<int32_t> ids = tok.encode("Hi there", true);
  EXPECT_NE(r.output.find(std::to_string(ids.size()) + " tokens"), std::string::npos) << r.output;
  for (const std::string& t : tok.tokens(ids)) EXPECT_NE(r.output.find("\"" + t + "\""), std::string::npos) << t;
}

// transformers' apply_chat_template(messages, tools=tools, add_generation_prompt=True) on a tokenizer
// directory, as {"text": the render, "ids": tokenize=True's ids}; `tools_path` "" for none.
nlohmann::json transformers_chat_ids(const std::string& dir, const std::string& messages_path, const std::string& tools_path,
                                     const hybridflow::testing::TempDir& tmp) {
  hybridflow::write_file_atomic(tmp.file("oracle.py"),
                                "import json, sys\n"
                                "from transformers import AutoTokenizer\n"
                                "tok = AutoTokenizer.from_pretrained(sys.argv[1])\n"
                                "msgs = json.load(open(sys.argv[2]))\n"
                                "tools = json.load(open(sys.argv[3])) if len(sys.argv) > 3 else None\n"
                                "text = tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, tokenize=False)\n"
                                "ids = tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, tokenize=True)\n"
                                "ids = ids['input_ids'] if isinstance(ids, dict) or hasattr(ids, 'keys') else ids\n"
                                "print(json.dumps({'text': text, 'ids': list(ids)}))\n");
  const std::string python = hybridflow::testing::python_for_tests();
  CommandResult oracle = hybridflow::testing::run_shell(python + " " + tmp.file("oracle.py") + " " + dir + " " +
                                                        messages_path + " " + tools_path + " 2>/dev/null");
  EXPECT_EQ(oracle.exit_code, 0) << "transformers oracle (" << python << ", made by scripts/setup.sh): " << oracle.output;
  if (oracle.exit_code != 0) return nullptr;
  return nlohmann::json::parse(oracle.output);
}

// --messages against transformers itself: apply_chat_template(tokenize=True, add_generation_prompt=True)
// on the published Qwen3 files gives the ids the command prints.
TEST(CliTokenize, MessagesGiveTransformersChatTemplateIds) {
  const std::string qwen3 = hybridflow::testing::tokenizer_data_dir() + "/qwen3";
  if (!hybridflow::file_exists(qwen3 + "/tokenizer_config.json")) GTEST_SKIP() << "not found: " << qwen3;
  hybridflow::testing::TempDir dir;
  const nlohmann::json messages = {{{"role", "system"}, {"content", "You add numbers."}},
                                   {{"role", "user"}, {"content", "What is 12+34? \"Quote\" ü"}}};
  hybridflow::write_file_atomic(dir.file("messages.json"), messages.dump());
  CommandResult r = run_hybridflow("tokenize --tokenizer " + qwen3 + " --messages " + dir.file("messages.json") + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json out = nlohmann::json::parse(r.output);
  const nlohmann::json expected = transformers_chat_ids(qwen3, dir.file("messages.json"), "", dir);
  ASSERT_FALSE(expected.is_null());
  EXPECT_EQ(out["text"], expected["text"]);
  EXPECT_EQ(out["ids"], expected["ids"]);
  EXPECT_NE(out["text"].get<std::string>().find("What is 12+34?"), std::string::npos) << out["text"];
}

// --tools with a multi-turn conversation holding tool calls and results: the render and ids
// transformers gives with tools=.
TEST(CliTokenize, ToolsAreRenderedAsTransformersRendersThem) {
  const std::string qwen3 = hybridflow::testing::tokenizer_data_dir() + "/qwen3";
  if (!hybridflow::file_exists(qwen3 + "/tokenizer_config.json")) GTEST_SKIP() << "not found: " << qwen3;
  hybridflow::testing::TempDir dir;
  const nlohmann::json tools = nlohmann::json::parse(R"([
    {"type": "function", "function": {"name": "multiply", "description": "a × b",
     "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}])");
  const nlohmann::json messages = nlohmann::json::parse(R"([
    {"role": "user", "content": "What is 12.5 × 4, then × 3?"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "multiply", "arguments": {"a": 12.5, "b": 4}}}]},
    {"role": "tool", "content": "50.0"},
    {"role": "assistant", "content": "Now × 3.", "tool_calls": [{"type": "function", "function": {"name": "multiply", "arguments": {"a": 50, "b": 3}}},
                                                                {"type": "function", "function": {"name": "multiply", "arguments": {"a": 3, "b": 50}}}]},
    {"role": "tool", "content": "150"}, {"role": "tool", "content": "150"}])");
  hybridflow::write_file_atomic(dir.file("messages.json"), messages.dump());
  hybridflow::write_file_atomic(dir.file("tools.json"), tools.dump());
  CommandResult r = run_hybridflow("tokenize --tokenizer " + qwen3 + " --messages " + dir.file("messages.json") +
                                   " --tools " + dir.file("tools.json") + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json out = nlohmann::json::parse(r.output);
  const nlohmann::json expected = transformers_chat_ids(qwen3, dir.file("messages.json"), dir.file("tools.json"), dir);
  ASSERT_FALSE(expected.is_null());
  EXPECT_EQ(out["text"], expected["text"]);
  EXPECT_EQ(out["ids"], expected["ids"]);
  const std::string text = out["text"].get<std::string>();
  EXPECT_NE(text.find("<tools>\n{\"function\": {\"description\": \"a × b\""), std::string::npos) << "tools not rendered:\n" << text;
  EXPECT_NE(text.find("<tool_response>\n150\n</tool_response>"), std::string::npos) << text;

  CommandResult plain = run_hybridflow("tokenize --tokenizer " + qwen3 + " --messages " + dir.file("messages.json") +
                                       " --tools " + dir.file("tools.json"));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_NE(plain.output.find(std::to_string(out["ids"].size()) + " tokens"), std::string::npos) << plain.output;
}

TEST(CliTokenize, ToolsErrorsSayWhatIsWrong) {
  const std::string qwen3 = hybridflow::testing::tokenizer_data_dir() + "/qwen3";
  hybridflow::testing::TempDir dir;
  hybridflow::write_file_atomic(dir.file("messages.json"), R"([{"role": "user", "content": "hi"}])");
  hybridflow::write_file_atomic(dir.file("object.json"), R"({"type": "function"})");
  hybridflow::write_file_atomic(dir.file("strings.json"), R"(["multiply"])");
  CommandResult without_messages = run_hybridflow("tokenize --tokenizer " + qwen3 + " --tools " + dir.file("object.json") + " hi");
  EXPECT_NE(without_messages.exit_code, 0);
  EXPECT_NE(without_messages.output.find("needs --messages"), std::string::npos) << without_messages.output;
  CommandResult not_list = run_hybridflow("tokenize --tokenizer " + qwen3 + " --messages " + dir.file("messages.json") +
                                          " --tools " + dir.file("object.json"));
  EXPECT_NE(not_list.exit_code, 0);
  EXPECT_NE(not_list.output.find(dir.file("object.json") + ": expected a non-empty JSON list of OpenAI function schemas"),
            std::string::npos) << not_list.output;
  CommandResult strings = run_hybridflow("tokenize --tokenizer " + qwen3 + " --messages " + dir.file("messages.json") +
                                         " --tools " + dir.file("strings.json"));
  EXPECT_NE(strings.exit_code, 0);
  EXPECT_NE(strings.output.find(dir.file("strings.json") + ": item 0 is string"), std::string::npos) << strings.output;
}

TEST(CliTokenize, ErrorsSayWhatIsWrong) {
  hybridflow::testing::TempDir dir;
  CommandResult none = run_hybridflow("tokenize --tokenizer " + dir.path());
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.output.find("exactly one"), std::string::npos) << none.output;
  CommandResult missing = run_hybridflow("tokenize --tokenizer " + dir.path() + " hello");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find(dir.file("tokenizer.json")), std::string::npos) << missing.output;
  hybridflow::write_file_atomic(dir.file("bad.json"), "{\"role\": \"user\"}");
  CommandResult not_list = run_hybridflow("tokenize --tokenizer " + dir.path() + " --messages " + dir.file("bad.json"));
  EXPECT_NE(not_list.exit_code, 0);
  EXPECT_NE(not_list.output.find(dir.file("bad.json")), std::string::npos) << not_list.output;
  EXPECT_NE(not_list.output.find("list"), std::string::npos) << not_list.output;
}

}  // namespace
