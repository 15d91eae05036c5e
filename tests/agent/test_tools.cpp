// Tools run as commands and over HTTP, the ToolSet (concurrency, order, truncation), argument checks and
// the tool config file.
#include "hybridflow/agent/tool_set.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>

#include "hybridflow/agent/command_tool.h"
#include "hybridflow/agent/http_tool.h"
#include "hybridflow/agent/multi_turn_config.h"
#include "hybridflow/agent/tool_config.h"
#include "hybridflow/core/config.h"
#include "hybridflow/core/fs.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "support/tiny_http_server.h"

namespace hybridflow::agent {
namespace {

using hybridflow::testing::error_of;
using hybridflow::testing::http_reply;
using hybridflow::testing::TempDir;
using hybridflow::testing::TinyServer;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

Json schema(const std::string& name, const Json& parameters = Json{{"type", "object"}, {"properties", Json::object()}}) {
  return Json{{"type", "function"}, {"function", {{"name", name}, {"description", "test tool"}, {"parameters", parameters}}}};
}

Json two_numbers() {
  return Json::parse(R"({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "integer"},
    "op": {"type": "string", "enum": ["add", "mul"]}}, "required": ["a", "b"]})");
}

std::shared_ptr<CommandTool> shell_tool(const std::string& name, const std::string& line, double timeout_s = 10,
                                        int64_t max_output = 1 << 20) {
  return std::make_shared<CommandTool>(schema(name), std::vector<std::string>{"/bin/sh", "-c", line},
                                       ProcessBounds{timeout_s, max_output}, "test");
}

TEST(ToolArguments, RequiredTypesEnumsAndClosedObjects) {
  Json p = two_numbers();
  EXPECT_EQ(check_tool_arguments(p, Json{{"a", 1.5}, {"b", 2}}), "");
  EXPECT_EQ(check_tool_arguments(p, Json{{"a", 1}, {"b", 2.0}, {"op", "mul"}, {"extra", true}}), "");
  EXPECT_EQ(check_tool_arguments(p, Json{{"a", 1}}), "missing required argument 'b'");
  EXPECT_EQ(check_tool_arguments(p, Json::array()), "arguments must be a JSON object, got array");
  EXPECT_EQ(check_tool_arguments(p, Json{{"a", "1"}, {"b", 2}}), "argument 'a' must be number, got string \"1\"");
  EXPECT_EQ(check_tool_arguments(p, Json{{"a", 1}, {"b", 2.5}}), "argument 'b' must be integer, got number 2.5");
  EXPECT_EQ(check_tool_arguments(p, Json{{"a", 1}, {"b", 2}, {"op", "div"}}),
            "argument 'op' must be one of [\"add\",\"mul\"], got \"div\"");
  Json closed = p;
  closed["additionalProperties"] = false;
  EXPECT_EQ(check_tool_arguments(closed, Json{{"a", 1}, {"b", 2}, {"c", 3}}), "unknown argument 'c'");
  Json either = Json::parse(R"({"type": "object", "properties": {"x": {"type": ["string", "null"]}}})");
  EXPECT_EQ(check_tool_arguments(either, Json{{"x", nullptr}}), "");
  EXPECT_EQ(check_tool_arguments(either, Json{{"x", 1}}), "argument 'x' must be string or null, got integer 1");
}

TEST(ToolSchema, MalformedSchemasAreErrorsNamingTheKey) {
  auto make = [](Json s) { CommandTool(std::move(s), {"true"}, {}, "tools.yaml: tools[0]"); };
  EXPECT_NE(error_of([&] { make(Json{{"type", "tool"}}); }).find("tools.yaml: tools[0]: tool_schema.type: expected 'function'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make(Json{{"type", "function"}, {"function", {{"description", "x"}}}}); })
                .find("tool_schema.function.name: expected a non-empty string"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make(Json{{"type", "function"}, {"function", {{"name", "x"}, {"parameters", {{"required", "a"}}}}}}); })
                .find("parameters.required: expected a list"),
            std::string::npos);
}

TEST(TruncateToolResponse, KeepsTheConfiguredSideOnCharacterBoundaries) {
  bool truncated = true;
  EXPECT_EQ(truncate_tool_response("short", 10, TruncateSide::middle, &truncated), "short");
  EXPECT_FALSE(truncated);
  const std::string text = "0123456789abcdefghij";  // 20 characters
  EXPECT_EQ(truncate_tool_response(text, 6, TruncateSide::left, &truncated),
            "012345\n[... 14 characters truncated ...]");
  EXPECT_TRUE(truncated);
  EXPECT_EQ(truncate_tool_response(text, 6, TruncateSide::right, &truncated),
            "[... 14 characters truncated ...]\nefghij");
  EXPECT_EQ(truncate_tool_response(text, 7, TruncateSide::middle, &truncated),
            "0123\n[... 13 characters truncated ...]\nhij");
  // Characters, not bytes: "é" and "€" are one each and never split.
  const std::string utf8 = "é€é€é€";  // 6 characters, 15 bytes
  EXPECT_EQ(truncate_tool_response(utf8, 6, TruncateSide::left, &truncated), utf8);
  EXPECT_EQ(truncate_tool_response(utf8, 3, TruncateSide::left, &truncated), "é€é\n[... 3 characters truncated ...]");
  EXPECT_EQ(truncate_tool_response(utf8, 3, TruncateSide::right, &truncated), "[... 3 characters truncated ...]\n€é€");
  EXPECT_EQ(truncate_side_from_name("middle", "k"), TruncateSide::middle);
  EXPECT_NE(error_of([] { truncate_side_from_name("both", "multi_turn.tool_response_truncate_side"); })
                .find("multi_turn.tool_response_truncate_side: expected left, right or middle, got 'both'"),
            std::string::npos);
}

TEST(CommandTool, ArgumentsOnStdinResultOnStdoutKwargsInTheEnvironment) {
  auto echo = shell_tool("echo", "cat");
  Json args = Json::parse(R"({"z": 1, "a": "ünïcode \"quoted\"\nline"})");
  ToolResult r = echo->call(args, nullptr);
  ASSERT_TRUE(r.ok()) << r.text;
  EXPECT_EQ(r.text, args.dump());  // key order kept, trailing newline dropped
  EXPECT_GE(r.seconds, 0.0);
  auto kwargs = shell_tool("kw", "printf '%s' \"$HF_TOOL_KWARGS\"");
  EXPECT_EQ(kwargs->call(Json::object(), Json{{"create_kwargs", {{"ground_truth", "42"}}}}).text,
            "{\"create_kwargs\":{\"ground_truth\":\"42\"}}");
}

TEST(CommandTool, FailuresAreErrorResultsNotExceptions) {
  ToolResult exit3 = shell_tool("t", "echo 'bad input' >&2; exit 3")->call(Json::object(), nullptr);
  EXPECT_EQ(exit3.status, ToolStatus::failed);
  EXPECT_EQ(exit3.text, "Error: tool 't' exited with status 3\nbad input\n");

  auto start = Clock::now();
  ToolResult slow = shell_tool("t", "sleep 30", 0.3)->call(Json::object(), nullptr);
  EXPECT_EQ(slow.status, ToolStatus::timed_out);
  EXPECT_LT(seconds_since(start), 5.0);
  EXPECT_NE(slow.text.find("did not finish within 0.3"), std::string::npos) << slow.text;

  ToolResult flood = shell_tool("t", "yes", 10, 10000)->call(Json::object(), nullptr);
  EXPECT_EQ(flood.status, ToolStatus::output_limit);
  EXPECT_NE(flood.text.find("more than 10000 bytes to stdout"), std::string::npos) << flood.text;

  ToolResult killed = shell_tool("t", "kill -9 $$")->call(Json::object(), nullptr);
  EXPECT_EQ(killed.status, ToolStatus::failed);
  EXPECT_NE(killed.text.find("killed by signal 9"), std::string::npos) << killed.text;

  auto missing = std::make_shared<CommandTool>(schema("m"), std::vector<std::string>{"/nonexistent/tool"}, ProcessBounds{},
                                               "test");
  ToolResult not_found = missing->call(Json::object(), nullptr);
  EXPECT_EQ(not_found.status, ToolStatus::failed);
  EXPECT_NE(not_found.text.find("cannot run '/nonexistent/tool'"), std::string::npos) << not_found.text;
}

TEST(CommandTool, InvalidArgumentsNeverReachTheProgram) {
  TempDir dir;
  auto tool = std::make_shared<CommandTool>(schema("calc", two_numbers()),
                                            std::vector<std::string>{"/bin/sh", "-c", "touch ran; cat"},
                                            ProcessBounds{}, "test", dir.path());
  ToolResult bad = tool->call(Json{{"a", 1}}, nullptr);
  EXPECT_EQ(bad.status, ToolStatus::invalid_arguments);
  EXPECT_EQ(bad.text, "Error: tool 'calc': missing required argument 'b'");
  EXPECT_FALSE(file_exists(dir.file("ran")));
  EXPECT_TRUE(tool->call(Json{{"a", 1}, {"b", 2}}, nullptr).ok());
  EXPECT_TRUE(file_exists(dir.file("ran")));  // and it ran in its working directory
}

TEST(ToolSet, RunsOneTurnsCallsConcurrentlyAndAnswersInCallOrder) {
  ToolSet tools;
  tools.add(shell_tool("slow_echo", "sleep 0.4; cat"));
  tools.add(shell_tool("fail", "exit 1"));
  std::vector<ToolCallRequest> calls;
  for (int i = 0; i < 4; ++i) calls.push_back({"slow_echo", Json{{"i", i}}});
  ToolSetOptions parallel;
  parallel.max_parallel_calls = 4;
  auto start = Clock::now();
  auto results = tools.run(calls, nullptr, parallel);
  double concurrent = seconds_since(start);
  ASSERT_EQ(results.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(results[static_cast<size_t>(i)].text, (Json{{"i", i}}.dump()));
  ToolSetOptions serial;
  serial.max_parallel_calls = 1;
  start = Clock::now();
  results = tools.run(calls, nullptr, serial);
  double one_at_a_time = seconds_since(start);
  EXPECT_GE(one_at_a_time, 1.6);
  EXPECT_LT(concurrent, one_at_a_time * 0.6) << concurrent << " s with 4 at once vs " << one_at_a_time << " s serially";
  for (int i = 0; i < 4; ++i) EXPECT_EQ(results[static_cast<size_t>(i)].text, (Json{{"i", i}}.dump()));

  // Unknown names and failures are results in their place; the other calls still run.
  results = tools.run({{"fail", Json::object()}, {"search", Json::object()}, {"slow_echo", Json{{"k", 1}}}}, nullptr,
                      parallel);
  EXPECT_EQ(results[0].status, ToolStatus::failed);
  EXPECT_EQ(results[1].status, ToolStatus::unknown_tool);
  EXPECT_EQ(results[1].text, "Error: no tool named 'search' (available: slow_echo, fail)");
  EXPECT_EQ(results[2].text, "{\"k\":1}");
  EXPECT_NE(error_of([&] { tools.add(shell_tool("fail", "true"), "t.yaml: tools[2]"); })
                .find("t.yaml: tools[2]: a tool named 'fail' is already defined"),
            std::string::npos);
}

TEST(ToolSet, TruncatesEachResultAndPassesEachToolItsKwargs) {
  ToolSet tools;
  tools.add(shell_tool("long", "printf '%0500d' 0"));
  tools.add(shell_tool("kw", "printf '%s' \"$HF_TOOL_KWARGS\""));
  ToolSetOptions options;
  options.max_tool_response_length = 100;
  options.truncate_side = TruncateSide::left;
  Json row_kwargs = {{"kw", {{"create_kwargs", {{"x", 1}}}}}, {"other", 2}};
  auto results = tools.run({{"long", Json::object()}, {"kw", Json::object()}}, row_kwargs, options);
  EXPECT_TRUE(results[0].truncated);
  EXPECT_EQ(results[0].text, std::string(100, '0') + "\n[... 400 characters truncated ...]");
  EXPECT_FALSE(results[1].truncated);
  EXPECT_EQ(results[1].text, "{\"create_kwargs\":{\"x\":1}}");
  EXPECT_EQ(tools.schemas()[0]["function"]["name"], "long");
}

TEST(HttpTool, PostsTheArgumentsAndReturnsTheBody) {
  std::string seen_body;
  TinyServer server([&](const std::string&, const std::string& body) {
    seen_body = body;
    Json args = Json::parse(body);
    return http_reply(200, std::to_string(args["a"].get<int>() * args["b"].get<int>()));
  });
  HttpTool tool(schema("mul", two_numbers()), server.url("/mul"), {5.0, 1 << 20}, {}, "test");
  ToolResult r = tool.call(Json{{"a", 6}, {"b", 7}}, Json{{"note", "é"}});
  ASSERT_TRUE(r.ok()) << r.text;
  EXPECT_EQ(r.text, "42");
  EXPECT_EQ(seen_body, "{\"a\":6,\"b\":7}");
  EXPECT_NE(server.last_head().find("POST /mul HTTP/1.1"), std::string::npos);
  EXPECT_NE(server.last_head().find("X-HF-Tool-Kwargs: {\"note\":\"\\u00e9\"}"), std::string::npos) << server.last_head();
}

TEST(HttpTool, ServerErrorsTimeoutsAndOversizedRepliesAreResults) {
  TinyServer broken([](const std::string&, const std::string&) { return http_reply(503, "overloaded"); });
  ToolResult r = HttpTool(schema("t"), broken.url(), {5.0, 1 << 20}, {}, "test").call(Json::object(), nullptr);
  EXPECT_EQ(r.status, ToolStatus::failed);
  EXPECT_EQ(r.text, "Error: tool 't' answered HTTP 503: overloaded");

  TinyServer silent([](const std::string&, const std::string&) { return std::string(); });
  auto start = Clock::now();
  r = HttpTool(schema("t"), silent.url(), {0.3, 1 << 20}, {}, "test").call(Json::object(), nullptr);
  EXPECT_EQ(r.status, ToolStatus::timed_out) << r.text;
  EXPECT_LT(seconds_since(start), 3.0);

  TinyServer huge([](const std::string&, const std::string&) { return http_reply(200, std::string(5000, 'z')); });
  r = HttpTool(schema("t"), huge.url(), {5.0, 1000}, {}, "test").call(Json::object(), nullptr);
  EXPECT_EQ(r.status, ToolStatus::output_limit) << r.text;
  EXPECT_NE(r.text.find("more than max_output_bytes (1000)"), std::string::npos) << r.text;

  r = HttpTool(schema("t"), "http://127.0.0.1:1/none", {2.0, 1000}, {}, "test").call(Json::object(), nullptr);
  EXPECT_EQ(r.status, ToolStatus::failed);
  EXPECT_NE(r.text.find("cannot connect"), std::string::npos) << r.text;

  EXPECT_NE(error_of([] { HttpTool(schema("t"), "http://tools.example.com/x", {}, {}, "t.yaml: tools[0]"); })
                .find("t.yaml: tools[0]: config.url: host 'tools.example.com' is not loopback; list it in config.allowed_hosts"),
            std::string::npos);
}

TEST(ToolConfig, LoadsVerlLayoutAndRunsCommandsInTheFilesDirectory) {
  TempDir dir;
  write_file_atomic(dir.file("calc.sh"), "#!/bin/sh\nread line\necho \"got $line\"\n");
  ::chmod(dir.file("calc.sh").c_str(), 0755);
  write_file_atomic(dir.file("tools.yaml"),
                    "tools:\n"
                    "  - class_name: verl.tools.base_tool.BaseTool  # not used\n"
                    "    config:\n"
                    "      type: command\n"
                    "      command: [./calc.sh]\n"
                    "      timeout_s: 5\n"
                    "    tool_schema:\n"
                    "      type: function\n"
                    "      function:\n"
                    "        name: calc\n"
                    "        description: 'Evaluate: an expression'\n"
                    "        parameters:\n"
                    "          type: object\n"
                    "          properties:\n"
                    "            expression: {type: string, description: the expression}\n"
                    "            digits: {type: integer}\n"
                    "          required: [expression]\n"
                    "  - config: {type: http, url: 'http://127.0.0.1:9/x'}\n"
                    "    tool_schema: {type: function, function: {name: web, description: d, parameters: {type: object}}}\n");
  ToolSet tools = load_tool_config(dir.file("tools.yaml"));
  EXPECT_EQ(tools.names(), (std::vector<std::string>{"calc", "web"}));
  // The schema keeps the file's key order, as transformers would render it.
  EXPECT_EQ(tools.find("calc")->schema().dump(),
            "{\"type\":\"function\",\"function\":{\"name\":\"calc\",\"description\":\"Evaluate: an expression\","
            "\"parameters\":{\"type\":\"object\",\"properties\":{\"expression\":{\"type\":\"string\",\"description\":"
            "\"the expression\"},\"digits\":{\"type\":\"integer\"}},\"required\":[\"expression\"]}}}");
  EXPECT_EQ(tools.find("calc")->call(Json{{"expression", "1+1"}}, nullptr).text, "got {\"expression\":\"1+1\"}");
}

TEST(ToolConfig, ErrorsNameTheFileTheEntryAndTheKey) {
  auto load_error = [](const std::string& yaml) {
    return error_of([&] { load_tool_config_from_string(yaml, "tools.yaml", ""); });
  };
  const std::string schema_yaml = "    tool_schema: {type: function, function: {name: calc}}\n";
  std::string msg = load_error("tools:\n  - config: {type: command, command: [x], timeout: 5}\n" + schema_yaml);
  EXPECT_NE(msg.find("tools.yaml: tools[0] ('calc') (line 2): unknown key 'config.timeout'; did you mean "
                     "'config.timeout_s'?"),
            std::string::npos)
      << msg;
  msg = load_error("tools:\n  - config: {type: command, command: [x], timeout_s: soon}\n" + schema_yaml);
  EXPECT_NE(msg.find("tools.yaml: tools[0] ('calc') (line 2): config.timeout_s: expected a number, got 'soon'"),
            std::string::npos)
      << msg;
  msg = load_error("tools:\n  - config: {type: command, command: [x]}\n");
  EXPECT_NE(msg.find("tools.yaml: tools[0] (line 2): tool_schema: missing"), std::string::npos) << msg;
  msg = load_error("tools:\n  - class_name: verl.tools.gsm8k_tool.Gsm8kTool\n    config: {type: native}\n" + schema_yaml);
  EXPECT_NE(msg.find("config.type: expected command, http, mcp or python; class_name "
                     "'verl.tools.gsm8k_tool.Gsm8kTool' names a Python class"),
            std::string::npos)
      << msg;
  msg = load_error("tools:\n  - class_name: verl.tools.search_tool.SearchTool\n" + schema_yaml);
  EXPECT_NE(msg.find("tools.yaml: tools[0] ('calc') (line 2): config: missing: expected config.type (command, http, "
                     "mcp or python); class_name 'verl.tools.search_tool.SearchTool' names a Python class"),
            std::string::npos)
      << msg;
  msg = load_error("tools:\n  - config: {type: shell}\n" + schema_yaml);
  EXPECT_NE(msg.find("config.type: expected command, http, mcp or python, got 'shell'"), std::string::npos) << msg;
  msg = load_error("tools:\n  - config: {type: command, command: []}\n" + schema_yaml);
  EXPECT_NE(msg.find("config.command: expected a non-empty list"), std::string::npos) << msg;
  msg = load_error("tools:\n  - config: {type: command, command: [a]}\n" + schema_yaml +
                   "  - config: {type: command, command: [b]}\n" + schema_yaml);
  EXPECT_NE(msg.find("tools.yaml: tools[1] ('calc'): a tool named 'calc' is already defined"), std::string::npos) << msg;
  msg = load_error("tools:\n  - config: {type: command, command: [a]\n");
  EXPECT_NE(msg.find("tools.yaml:3:1: not valid YAML"), std::string::npos) << msg;
  msg = load_error("functions: []\n");
  EXPECT_NE(msg.find("tools.yaml: expected a map with a 'tools' list"), std::string::npos) << msg;
  msg = error_of([] { load_tool_config("/nonexistent/tools.yaml"); });
  EXPECT_NE(msg.find("tool config '/nonexistent/tools.yaml'"), std::string::npos) << msg;
  EXPECT_EQ(load_tool_config_from_string("tools: []\n", "t.yaml", "").size(), 0u);
  // A shell line for `command` runs under /bin/sh -c.
  ToolSet shell = load_tool_config_from_string("tools:\n  - config: {type: command, command: 'echo $((6*7))'}\n" + schema_yaml,
                                               "t.yaml", "");
  EXPECT_EQ(shell.find("calc")->call(Json::object(), nullptr).text, "42");
}

TEST(MultiTurnToolConfig, ReadsVerlKeysWithDefaultsAndChecksThem) {
  const std::string defaults =
      "multi_turn:\n  tool_config_path: null\n  interaction_config_path: null\n  max_parallel_calls: 1\n"
      "  max_tool_response_length: 256\n  tool_response_truncate_side: middle\n";
  Config config = Config::load_from_string(defaults, "multi_turn:\n  tool_config_path: tools.yaml\n"
                                                     "  max_parallel_calls: 8\n  tool_response_truncate_side: left\n",
                                           "run.yaml", {});
  MultiTurnToolConfig read = read_multi_turn_tool_config(config.subtree("multi_turn"));
  EXPECT_EQ(read.tool_config_path, "tools.yaml");
  EXPECT_EQ(read.interaction_config_path, "");
  EXPECT_EQ(read.options.max_parallel_calls, 8);
  EXPECT_EQ(read.options.max_tool_response_length, 256);
  EXPECT_EQ(read.options.truncate_side, TruncateSide::left);
  Config bad = Config::load_from_string(defaults, "multi_turn:\n  max_parallel_calls: 0\n", "run.yaml", {});
  std::string msg = error_of([&] { read_multi_turn_tool_config(bad.subtree("multi_turn")); });
  EXPECT_NE(msg.find("multi_turn.max_parallel_calls (run.yaml:2:"), std::string::npos) << msg;
  Config side = Config::load_from_string(defaults, "multi_turn:\n  tool_response_truncate_side: top\n", "run.yaml", {});
  msg = error_of([&] { read_multi_turn_tool_config(side.subtree("multi_turn")); });
  EXPECT_NE(msg.find("multi_turn.tool_response_truncate_side (run.yaml:2:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected left, right or middle, got 'top'"), std::string::npos) << msg;
}

}  // namespace
}  // namespace hybridflow::agent
