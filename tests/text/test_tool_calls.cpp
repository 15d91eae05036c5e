// Tool-call parsing: calls rendered by chat templates (Qwen3's published one for the Hermes format, the
// Llama 3.1-style test template for JSON calls) parse back to the same names and arguments; malformed
// and hostile texts give errors with their byte spans, never an exception.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "hybridflow/text/chat_template.h"
#include "hybridflow/text/tool_calls.h"
#include "support/testdata_dir.h"
#include "text/tool_template.h"

namespace hybridflow::text {
namespace {

using json = nlohmann::ordered_json;

json call_message(const std::string& content, const std::vector<std::pair<std::string, json>>& calls) {
  json m = {{"role", "assistant"}, {"content", content}, {"tool_calls", json::array()}};
  for (const auto& [name, arguments] : calls)
    m["tool_calls"].push_back({{"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}});
  return m;
}

const json kCalcTools = json::parse(R"([
  {"type": "function", "function": {"name": "calc", "description": "Evaluate an expression",
   "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}},
  {"type": "function", "function": {"name": "lookup", "description": "Find a row",
   "parameters": {"type": "object", "properties": {"key": {"type": "string"}, "limit": {"type": "integer"}}}}}
])");

// The text between the last occurrence of `open` and the following `close`: one rendered turn's body.
std::string last_turn(const std::string& rendered, const std::string& open, const std::string& close) {
  const size_t begin = rendered.rfind(open);
  EXPECT_NE(begin, std::string::npos) << rendered;
  const size_t body = begin + open.size();
  return rendered.substr(body, rendered.find(close, body) - body);
}

void expect_calls(const ParsedToolCalls& parsed, const std::string& text,
                  const std::vector<std::pair<std::string, json>>& expected) {
  ASSERT_TRUE(parsed.ok()) << parsed.errors[0].message << "\nin: " << text;
  ASSERT_EQ(parsed.calls.size(), expected.size()) << text;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(parsed.calls[i].name, expected[i].first);
    const json want = expected[i].second.is_string() ? json::parse(expected[i].second.get<std::string>()) : expected[i].second;
    EXPECT_EQ(parsed.calls[i].arguments, want) << text;
    EXPECT_EQ(parsed.calls[i].arguments.dump(), want.dump()) << "key order must be kept";
    ASSERT_LE(parsed.calls[i].end, text.size());
    if (i > 0) {
      EXPECT_GE(parsed.calls[i].begin, parsed.calls[i - 1].end);
    }
  }
}

TEST(ToolCalls, HermesCallsRenderedByQwen3ParseBack) {
  const std::string config_path = testing::tokenizer_data_dir() + "/qwen3/tokenizer_config.json";
  if (!std::filesystem::exists(config_path)) GTEST_SKIP() << "no test data at " << config_path;
  const TokenizerConfig config = TokenizerConfig::load(config_path);
  using Call = std::pair<std::string, json>;
  const std::vector<std::vector<Call>> turns = {
      {Call("calc", json{{"expr", "2+3*4"}})},
      {Call("calc", json{{"expr", "1/3"}}), Call("lookup", json{{"key", "Zürich \"HB\"\n<tool_call></tool_call>"}, {"limit", 2}}),
       Call("lookup", json::object())},
      {Call("lookup", json("{\"limit\": 5, \"key\": \"a}b{\"}"))},  // arguments as a JSON string, keys out of order
  };
  for (const std::string content : {"", "Let me compute that."}) {
    for (const auto& calls : turns) {
      const json messages = json::array({{{"role", "user"}, {"content", "q"}}, call_message(content, calls)});
      const std::string rendered = apply_chat_template(config, messages, false, kCalcTools);
      const std::string turn = last_turn(rendered, "<|im_start|>assistant\n", "<|im_end|>");
      const ParsedToolCalls parsed = parse_tool_calls(turn, ToolCallFormat::hermes);
      expect_calls(parsed, turn, calls);
      // The last assistant turn after the query gets an empty think block from Qwen3's template.
      EXPECT_EQ(parsed.content, "<think>\n\n</think>" + (content.empty() ? "" : "\n\n" + content));
      for (const ToolCall& c : parsed.calls) {
        EXPECT_EQ(turn.substr(c.begin, 11), "<tool_call>");
        EXPECT_EQ(turn.substr(c.end - 12, 12), "</tool_call>");
      }
    }
  }
}

TEST(ToolCalls, LlamaJsonCallsRenderedByTheTemplateParseBack) {
  const ChatTemplate tpl = ChatTemplate::parse(kToolsInUserTurnTemplate);
  ChatTemplateOptions options;
  options.tools = kCalcTools;
  options.variables = {{"bos_token", "<s>"}};
  for (const json& arguments : {json({{"expr", "6*7"}}), json({{"key", "q\"uote ✓"}, {"limit", 1}}), json::object()}) {
    const std::string name = arguments.contains("expr") ? "calc" : "lookup";
    const json messages = json::array({{{"role", "user"}, {"content", "q"}}, call_message("", {{name, arguments}})});
    const std::string turn = last_turn(tpl.render(messages, options), "<|hdr|>assistant<|/hdr|>\n\n", "<|eot|>");
    for (const std::string prefix : {"", "<|python_tag|>", "\n<|python_tag|> "}) {
      const std::string text = prefix + turn;
      const ParsedToolCalls parsed = parse_tool_calls(text, ToolCallFormat::llama3_json);
      expect_calls(parsed, text, {{name, arguments}});
      EXPECT_EQ(parsed.content, "");
      EXPECT_EQ(parsed.calls[0].end, text.size());
    }
  }
}

TEST(ToolCalls, LlamaJsonSeveralCallsAndPlainContent) {
  const std::string text = R"({"name": "calc", "parameters": {"expr": "1"}}; {"name": "lookup", "arguments": {"key": "k"}})";
  const ParsedToolCalls parsed = parse_tool_calls(text, ToolCallFormat::llama3_json);
  expect_calls(parsed, text, {{"calc", {{"expr", "1"}}}, {"lookup", {{"key", "k"}}}});
  EXPECT_EQ(parsed.calls[1].begin, text.find("{\"name\": \"lookup\""));

  const std::string plain = "The answer is 42. {\"name\": \"calc\"} is how I would call it.";
  const ParsedToolCalls answer = parse_tool_calls(plain, ToolCallFormat::llama3_json);
  EXPECT_TRUE(answer.ok());
  EXPECT_TRUE(answer.calls.empty());
  EXPECT_EQ(answer.content, plain);
}

TEST(ToolCalls, HermesKeepsTextAroundCallsAsContent) {
  const std::string text = "<think>\nneed calc\n</think>\n\nChecking.\n<tool_call>\n{\"name\": \"calc\", \"arguments\": {}}\n</tool_call>\n";
  const ParsedToolCalls parsed = parse_tool_calls(text, ToolCallFormat::hermes);
  expect_calls(parsed, text, {{"calc", json::object()}});
  EXPECT_EQ(parsed.content, "<think>\nneed calc\n</think>\n\nChecking.");
  const ParsedToolCalls none = parse_tool_calls("  just text  ", ToolCallFormat::hermes);
  EXPECT_TRUE(none.ok());
  EXPECT_TRUE(none.calls.empty());
  EXPECT_EQ(none.content, "just text");
}

// One malformed call among good ones: the good ones still parse, the bad one is an error naming the
// problem and spanning exactly its bytes.
struct Hostile {
  std::string call_text;
  std::string expected_message_part;
};

TEST(ToolCalls, HermesMalformedCallsAreErrorsWithSpans) {
  const std::string good = "<tool_call>{\"name\": \"calc\", \"arguments\": {\"expr\": \"1\"}}</tool_call>";
  const std::vector<Hostile> hostile = {
      {"<tool_call>{\"name\": \"calc\", \"arguments\": {\"expr\": }}</tool_call>", "invalid JSON"},
      {"<tool_call>{\"arguments\": {}}</tool_call>", "missing \"name\""},
      {"<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>", "\"name\" must be a non-empty string"},
      {"<tool_call>{\"name\": 7, \"arguments\": {}}</tool_call>", "\"name\" must be a non-empty string, got number"},
      {"<tool_call>{\"name\": \"calc\"}</tool_call>", "missing \"arguments\""},
      {"<tool_call>{\"name\": \"calc\", \"arguments\": [1]}</tool_call>", "\"arguments\" must be a JSON object, got array"},
      {"<tool_call>{\"name\": \"calc\", \"arguments\": \"{oops\"}</tool_call>", "is a string that is not JSON"},
      {"<tool_call>[\"calc\"]</tool_call>", "expected a JSON object"},
      {"<tool_call></tool_call>", "invalid JSON"},
      {"<tool_call>{\"name\": \"calc\", \"arguments\": {\"s\": \"\xff\xfe\"}}</tool_call>", "invalid JSON"},
      {"<tool_call>{\"name\": \"calc\", \"arguments\": " + std::string(200, '[') + std::string(200, ']') + "}</tool_call>",
       "nested deeper than 64"},
      {"</tool_call>", "without an opening <tool_call>"},
  };
  for (const Hostile& h : hostile) {
    const std::string text = "pre " + good + " mid " + h.call_text + " " + good;
    const ParsedToolCalls parsed = parse_tool_calls(text, ToolCallFormat::hermes);
    ASSERT_EQ(parsed.errors.size(), 1u) << text;
    EXPECT_NE(parsed.errors[0].message.find(h.expected_message_part), std::string::npos) << parsed.errors[0].message;
    EXPECT_EQ(text.substr(parsed.errors[0].begin, parsed.errors[0].end - parsed.errors[0].begin), h.call_text);
    ASSERT_EQ(parsed.calls.size(), 2u) << text;
    EXPECT_EQ(parsed.calls[1].begin, text.size() - good.size());
    EXPECT_EQ(parsed.content, "pre  mid");
  }
  // The second attempt in the turn is the one named.
  const ParsedToolCalls numbered = parse_tool_calls(good + "<tool_call>{}</tool_call>", ToolCallFormat::hermes);
  ASSERT_EQ(numbered.errors.size(), 1u);
  EXPECT_EQ(numbered.errors[0].message, "tool call 2: missing \"name\"");
}

TEST(ToolCalls, HermesUnclosedTagsEndTheirCallWhereTheNextBegins) {
  const std::string good = "<tool_call>{\"name\": \"calc\", \"arguments\": {}}</tool_call>";
  const std::string cut = "<tool_call>{\"name\": \"calc\", \"argu";  // sampling stopped at the token limit
  const ParsedToolCalls at_end = parse_tool_calls(good + cut, ToolCallFormat::hermes);
  ASSERT_EQ(at_end.calls.size(), 1u);
  ASSERT_EQ(at_end.errors.size(), 1u);
  EXPECT_EQ(at_end.errors[0].message, "tool call 2: <tool_call> is not closed by </tool_call>");
  EXPECT_EQ(at_end.errors[0].begin, good.size());
  EXPECT_EQ(at_end.errors[0].end, good.size() + cut.size());
  const ParsedToolCalls before_next = parse_tool_calls(cut + good, ToolCallFormat::hermes);
  ASSERT_EQ(before_next.errors.size(), 1u);
  EXPECT_EQ(before_next.errors[0].end, cut.size());
  ASSERT_EQ(before_next.calls.size(), 1u);
  EXPECT_EQ(before_next.calls[0].begin, cut.size());
}

TEST(ToolCalls, LlamaJsonMalformedCallsAreErrors) {
  const std::vector<Hostile> hostile = {
      {"{\"name\": \"calc\", \"parameters\": {\"expr\": \"1\"}", "not closed"},
      {"{\"name\": \"calc\" \"parameters\": {}}", "invalid JSON"},
      {"{\"parameters\": {}}", "missing \"name\""},
      {"{\"name\": \"calc\"}", "missing \"parameters\""},
      {"{\"name\": \"calc\", \"parameters\": 3}", "\"parameters\" must be a JSON object, got number"},
      {"<|python_tag|>brave_search.call(query=\"x\")", "built-in tool calls are not supported"},
      {"{\"name\": \"calc\", \"parameters\": {}} and then some prose", "text after the tool call"},
      {std::string(100, '{'), "nested deeper than 64"},
  };
  for (const Hostile& h : hostile) {
    const ParsedToolCalls parsed = parse_tool_calls(h.call_text, ToolCallFormat::llama3_json);
    ASSERT_FALSE(parsed.ok()) << h.call_text;
    EXPECT_NE(parsed.errors.back().message.find(h.expected_message_part), std::string::npos) << parsed.errors.back().message;
    EXPECT_LE(parsed.errors.back().end, h.call_text.size());
    EXPECT_EQ(parsed.content, "");
  }
  // A good call before a broken one survives; the error spans the broken one only.
  const std::string text = "{\"name\": \"calc\", \"parameters\": {}}; {\"name\": 1, \"parameters\": {}}";
  const ParsedToolCalls mixed = parse_tool_calls(text, ToolCallFormat::llama3_json);
  ASSERT_EQ(mixed.calls.size(), 1u);
  ASSERT_EQ(mixed.errors.size(), 1u);
  EXPECT_EQ(mixed.errors[0].begin, text.find("{\"name\": 1"));
  EXPECT_EQ(mixed.errors[0].end, text.size());
  EXPECT_EQ(mixed.errors[0].message.rfind("tool call 2: ", 0), 0u) << mixed.errors[0].message;
}

// Random edits of well-formed turns (bytes deleted, inserted, tag fragments spliced in): parsing never
// throws, every span lies in the text, calls and errors do not overlap, every call has a name and
// object arguments, and text with no tag (hermes) or not starting with a call (llama3_json) has none.
TEST(ToolCalls, RandomlyDamagedTurnsNeverThrowAndKeepSpansConsistent) {
  const std::string hermes = "Sure.\n<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expr\": \"[1, {2}]\", \"n\": [1, 2]}}\n</tool_call>\n"
                             "<tool_call>\n{\"name\": \"lookup\", \"arguments\": \"{\\\"key\\\": \\\"a\\\\\\\"b\\\"}\"}\n</tool_call>";
  const std::string llama = "<|python_tag|>{\"name\": \"calc\", \"parameters\": {\"expr\": \"{x}\"}}; {\"name\": \"lookup\", \"parameters\": {}}";
  const std::vector<std::string> pieces = {"{", "}", "[", "]", "\"", "\\", ";", " ", "\n", "<tool_call>", "</tool_call>",
                                           "<|python_tag|>", "\xc3", "\xff", "name", ":", ","};
  std::mt19937 rng(20261127);
  auto below = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  int with_calls = 0, with_errors = 0;
  for (int i = 0; i < 4000; ++i) {
    const ToolCallFormat format = i % 2 == 0 ? ToolCallFormat::hermes : ToolCallFormat::llama3_json;
    std::string text = format == ToolCallFormat::hermes ? hermes : llama;
    const size_t edits = 1 + below(4);
    for (size_t e = 0; e < edits && !text.empty(); ++e) {
      const size_t at = below(text.size());
      if (below(2) == 0) {
        text.erase(at, 1 + below(std::min<size_t>(8, text.size() - at)));
      } else {
        text.insert(at, pieces[below(pieces.size())]);
      }
    }
    ParsedToolCalls parsed;
    ASSERT_NO_THROW(parsed = parse_tool_calls(text, format)) << text;
    std::vector<std::pair<size_t, size_t>> spans;
    for (const ToolCall& c : parsed.calls) {
      EXPECT_FALSE(c.name.empty()) << text;
      EXPECT_TRUE(c.arguments.is_object()) << text;
      spans.emplace_back(c.begin, c.end);
    }
    for (const ToolCallError& e : parsed.errors) {
      EXPECT_FALSE(e.message.empty()) << text;
      spans.emplace_back(e.begin, e.end);
    }
    std::sort(spans.begin(), spans.end());
    for (size_t k = 0; k < spans.size(); ++k) {
      EXPECT_LT(spans[k].first, spans[k].second) << text;
      EXPECT_LE(spans[k].second, text.size()) << text;
      if (k > 0) {
        EXPECT_LE(spans[k - 1].second, spans[k].first) << "overlapping spans in: " << text;
      }
    }
    if (format == ToolCallFormat::hermes && text.find("tool_call>") == std::string::npos) {
      EXPECT_TRUE(spans.empty()) << text;
    }
    const size_t first = text.find_first_not_of(" \t\r\n");
    if (format == ToolCallFormat::llama3_json && first != std::string::npos && text[first] != '{' &&
        text.compare(first, 14, "<|python_tag|>") != 0) {
      EXPECT_TRUE(spans.empty()) << text;
      EXPECT_EQ(parsed.content, text);
    }
    with_calls += !parsed.calls.empty();
    with_errors += !parsed.errors.empty();
  }
  // Both outcomes are exercised, so the invariants above are checked on calls and on errors.
  EXPECT_GT(with_calls, 1000);
  EXPECT_GT(with_errors, 1000);
}

TEST(ToolCalls, FormatNames) {
  EXPECT_EQ(tool_call_format_from_name("hermes"), ToolCallFormat::hermes);
  EXPECT_EQ(tool_call_format_from_name("llama3_json"), ToolCallFormat::llama3_json);
  EXPECT_STREQ(tool_call_format_name(ToolCallFormat::llama3_json), "llama3_json");
  try {
    tool_call_format_from_name("xml");
    FAIL() << "accepted an unknown format";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"hermes\" or \"llama3_json\""), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hybridflow::text
