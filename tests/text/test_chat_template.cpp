// Real chat templates (Llama 3 and Qwen3 tokenizer_config.json from the shared test data) rendered by
// hybridflow's apply_chat_template must be byte-identical to transformers'
// AutoTokenizer.from_pretrained(dir).apply_chat_template(..., tokenize=False), which
// tests/text/chat_template_oracle.py runs on the same cases in one Python process.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "hybridflow/text/chat_template.h"
#include "text/chat_template_oracle.h"

namespace hybridflow::text {
namespace {

using json = nlohmann::ordered_json;

struct ChatCase {
  std::string name;
  std::string model;  // a folder of testdata/tokenizers
  json messages;
  bool add_generation_prompt = false;
  json tools = nullptr;
  json kwargs = json::object();
};

json msg(const std::string& role, const json& content) { return {{"role", role}, {"content", content}}; }

const json kWeatherTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city, in °C.",
   "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. \"Zürich\""},
   "days": {"type": "integer", "default": 1}, "units": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "add", "description": "a + b",
   "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}
])");

json tool_call(const std::string& name, const json& arguments) {
  return {{"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}};
}

const std::string kTricky = "Quotes \"double\" and 'single', back\\slash, tabs\tand\nnew\n\nlines; unicode: héllo 中文 ✓ 🚀 — <b>&amp;</b> {{ not a tag }} {% neither %}";

std::vector<ChatCase> make_cases() {
  std::vector<ChatCase> cases;
  const json single = json::array({msg("user", "What is 2+2?")});
  const json with_system = json::array({msg("system", "You are terse."), msg("user", "Hi there")});
  const json multi = json::array({msg("system", "You are a helpful assistant."), msg("user", "Hello"),
                                  msg("assistant", "Hi! How can I help?"), msg("user", "Tell me a joke."),
                                  msg("assistant", "Why did the chicken cross the road?"), msg("user", "Why?")});
  const json no_system_multi = json::array({msg("user", "one"), msg("assistant", "two"), msg("user", "three")});
  const json tricky = json::array({msg("system", "  padded system  \n"), msg("user", kTricky), msg("assistant", kTricky)});
  for (const std::string model : {"llama3", "qwen3"}) {
    cases.push_back({model + "_single_turn_prompt", model, single, true});
    cases.push_back({model + "_single_turn_no_prompt", model, single, false});
    cases.push_back({model + "_system_prompt", model, with_system, true});
    cases.push_back({model + "_multi_turn_prompt", model, multi, true});
    cases.push_back({model + "_multi_turn_no_prompt", model, multi, false});
    cases.push_back({model + "_multi_turn_no_system", model, no_system_multi, true});
    cases.push_back({model + "_quotes_newlines_unicode", model, tricky, false});
    // Llama 3's template here ignores tools; passing them must not change that.
    cases.push_back({model + "_with_tools", model, with_system, true, kWeatherTools});
  }
  // Qwen3's thinking switch and reasoning handling.
  cases.push_back({"qwen3_thinking_disabled", "qwen3", single, true, nullptr, {{"enable_thinking", false}}});
  cases.push_back({"qwen3_thinking_enabled", "qwen3", single, true, nullptr, {{"enable_thinking", true}}});
  json reasoning_last = json::array({msg("user", "Solve x+1=3"), msg("assistant", "x = 2")});
  reasoning_last[1]["reasoning_content"] = "\nSubtract 1 from both sides.\n";
  cases.push_back({"qwen3_reasoning_content_last", "qwen3", reasoning_last, false});
  json reasoning_history = reasoning_last;
  reasoning_history.push_back(msg("user", "And x+2=3?"));
  cases.push_back({"qwen3_reasoning_content_in_history", "qwen3", reasoning_history, true, nullptr, {{"enable_thinking", false}}});
  json reasoning_alias = json::array({msg("user", "q"), msg("assistant", "a")});
  reasoning_alias[1]["reasoning"] = "via the 'reasoning' key";
  cases.push_back({"qwen3_reasoning_alias", "qwen3", reasoning_alias, false});
  const json inline_think = json::array({msg("user", "q1"), msg("assistant", "<think>\nhidden steps\n</think>\n\nvisible answer"),
                                         msg("user", "q2"), msg("assistant", "<think>\nlast steps\n</think>\n\nlast answer")});
  cases.push_back({"qwen3_inline_think_tags", "qwen3", inline_think, false});
  // Qwen3 tools: definitions, assistant tool calls (arguments as objects and as a JSON string), tool results.
  cases.push_back({"qwen3_tools_definitions", "qwen3", single, true, kWeatherTools});
  cases.push_back({"qwen3_tools_definitions_with_system", "qwen3", with_system, true, kWeatherTools});
  json tool_turns = json::array({msg("system", "Use tools when useful."), msg("user", "Weather in Zürich and 2+3?")});
  json call = msg("assistant", "");
  call["tool_calls"] = json::array({tool_call("get_weather", {{"city", "Zürich"}, {"days", 2}}),
                                    tool_call("add", "{\"a\": 2, \"b\": 3.5}")});
  tool_turns.push_back(call);
  json weather_result = msg("tool", "{\"temp_c\": 21.5, \"sky\": \"clear\"}");
  weather_result["name"] = "get_weather";
  tool_turns.push_back(weather_result);
  tool_turns.push_back(msg("tool", "5.5"));
  tool_turns.push_back(msg("assistant", "It is 21.5 °C and clear; 2+3.5 = 5.5."));
  cases.push_back({"qwen3_tool_calls_and_results", "qwen3", tool_turns, false, kWeatherTools});
  json tool_then_prompt = tool_turns;
  tool_then_prompt.erase(tool_then_prompt.size() - 1);
  cases.push_back({"qwen3_tool_results_then_prompt", "qwen3", tool_then_prompt, true, kWeatherTools});
  json call_with_text = json::array({msg("user", "add 1 and 2"), msg("assistant", "Let me add.")});
  call_with_text[1]["tool_calls"] = json::array({{{"name", "add"}, {"arguments", {{"a", 1}, {"b", 2}}}}});  // no "function" wrapper
  call_with_text.push_back(msg("tool", "<tool_response>3</tool_response>"));
  cases.push_back({"qwen3_tool_call_with_content_unwrapped", "qwen3", call_with_text, true, kWeatherTools});
  // Null values are dropped before rendering (transformers 5): Qwen3 then fails on the missing content.
  json null_content = json::array({msg("user", "q"), msg("assistant", nullptr)});
  null_content[1]["tool_calls"] = json::array({tool_call("add", {{"a", 1}})});
  cases.push_back({"qwen3_null_content_fails_as_in_transformers", "qwen3", null_content, false});
  json null_name = json::array({msg("user", "q")});
  null_name[0]["name"] = nullptr;
  cases.push_back({"qwen3_null_key_dropped", "qwen3", null_name, true});
  return cases;
}

const std::vector<ChatCase>& cases() {
  static const std::vector<ChatCase> all = make_cases();
  return all;
}

std::string tokenizer_dir(const std::string& model) { return testing::testdata_dir() + "/tokenizers/" + model; }

class ChatTemplateAgainstTransformers : public ::testing::TestWithParam<size_t> {
 protected:
  static void SetUpTestSuite() {
    json request = {{"chat", json::array()}};
    for (const auto& c : cases()) {
      if (!std::filesystem::exists(tokenizer_dir(c.model) + "/tokenizer_config.json")) continue;
      request["chat"].push_back({{"tokenizer_dir", tokenizer_dir(c.model)},
                                 {"messages", c.messages},
                                 {"tools", c.tools},
                                 {"add_generation_prompt", c.add_generation_prompt},
                                 {"kwargs", c.kwargs}});
    }
    oracle_ = new testing::OracleAnswer(testing::ask_oracle(request));
  }
  static void TearDownTestSuite() {
    delete oracle_;
    oracle_ = nullptr;
  }
  static testing::OracleAnswer* oracle_;
};

testing::OracleAnswer* ChatTemplateAgainstTransformers::oracle_ = nullptr;

TEST_P(ChatTemplateAgainstTransformers, RendersByteIdentically) {
  const ChatCase& c = cases()[GetParam()];
  const std::string config_path = tokenizer_dir(c.model) + "/tokenizer_config.json";
  if (!std::filesystem::exists(config_path)) GTEST_SKIP() << "no test data at " << config_path << " (set HF_TESTDATA)";
  ASSERT_EQ(oracle_->problem(), "");
  // The answer's index: cases whose data is missing were not sent (all or none are, per model folder).
  size_t index = 0;
  for (size_t i = 0; i < GetParam(); ++i)
    if (std::filesystem::exists(tokenizer_dir(cases()[i].model) + "/tokenizer_config.json")) ++index;
  const json& expected = oracle_->answer["chat"][index];
  const TokenizerConfig config = TokenizerConfig::load(config_path);
  std::string got;
  try {
    got = apply_chat_template(config, c.messages, c.add_generation_prompt, c.tools, c.kwargs);
  } catch (const TemplateError& e) {
    if (expected.contains("error")) {
      std::printf("both fail: transformers: %s | hybridflow: %s\n", expected["error"].get<std::string>().c_str(), e.what());
      return;
    }
    FAIL() << "hybridflow threw: " << e.what() << "\ntransformers rendered:\n" << expected["output"].get<std::string>();
  }
  ASSERT_FALSE(expected.contains("error")) << "transformers raised " << expected["error"] << " but hybridflow rendered:\n" << got;
  EXPECT_EQ(got, expected["output"].get<std::string>());
  const std::string last = c.messages.back()["content"].get<std::string>();
  EXPECT_NE(got.find(last.substr(0, 5)), std::string::npos)
      << "the rendering does not contain the last message: the comparison would be vacuous";
}

INSTANTIATE_TEST_SUITE_P(Cases, ChatTemplateAgainstTransformers, ::testing::Range<size_t>(0, cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) { return cases()[info.param].name; });

TEST(ChatTemplate, RenderTakesOptionsAndVariablesDirectly) {
  ChatTemplate t = ChatTemplate::parse(
      "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
      "{% if tools %}{{ tools | length }} tools{% endif %}{% if add_generation_prompt %}>{% endif %}");
  ChatTemplateOptions o;
  o.add_generation_prompt = true;
  o.tools = json::array({json::object()});
  o.variables = {{"bos_token", "<s>"}};
  EXPECT_EQ(t.render(json::array({msg("user", "hi")}), o), "<s>[user:hi]1 tools>");
  EXPECT_THROW(t.render(json::array()), TemplateError);
  o.variables = {{"messages", 1}};
  EXPECT_THROW(t.render(json::array({msg("user", "hi")}), o), TemplateError);
}

TEST(ChatTemplate, ApplyUsesTheToolUseTemplateWhenToolsAreGiven) {
  TokenizerConfig config = TokenizerConfig::from_json(
      json::parse(R"({"chat_template": [{"name": "default", "template": "D{{ eos_token }}"},
                                        {"name": "tool_use", "template": "T{{ tools | length }}"}],
                      "eos_token": {"content": "</s>", "lstrip": false}})"),
      "inline");
  EXPECT_EQ(apply_chat_template(config, json::array({msg("user", "x")}), false), "D</s>");
  EXPECT_EQ(apply_chat_template(config, json::array({msg("user", "x")}), false, json::array({1, 2})), "T2");
  EXPECT_EQ(apply_chat_template(config, json::array({msg("user", "x")}), false, nullptr, {{"eos_token", "E"}}), "DE");
}

}  // namespace
}  // namespace hybridflow::text
