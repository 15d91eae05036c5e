// MCP tools against a real server written with the `mcp` Python package (FastMCP over stdio).
#include "hybridflow/agent/mcp_tool.h"

#include <gtest/gtest.h>

#include <chrono>

#include "hybridflow/agent/tool_config.h"
#include "support/error_of.h"
#include "support/python.h"
#include "support/temp_dir.h"

namespace hybridflow::agent {
namespace {

using hybridflow::testing::error_of;
using hybridflow::testing::python_for_tests;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

std::string server_script() { return HF_SOURCE_DIR "/tests/agent/mcp_test_server.py"; }

std::string mcp_config(const std::string& extra_config = "", const std::string& entry_extra = "") {
  return "tools:\n"
         "  - class_name: verl.tools.mcp_base_tool.MCPBaseTool\n"
         "    config:\n"
         "      type: mcp\n"
         "      command: ['" + python_for_tests() + "', '" + server_script() + "']\n"
         "      startup_timeout_s: 60\n" + extra_config + entry_extra;
}

// One server for the tests that do not break it (starting Python with mcp takes a second or two).
const ToolSet& shared_tools() {
  static ToolSet tools = load_tool_config_from_string(mcp_config("      timeout_s: 2\n      max_output_bytes: 100000\n"),
                                                      "mcp.yaml", "");
  return tools;
}

TEST(McpTool, DiscoversTheServersToolsWithTheirInputSchemas) {
  const ToolSet& tools = shared_tools();
  EXPECT_EQ(tools.names(), (std::vector<std::string>{"add", "capital", "nap", "die", "blob"}));
  const Json& add = tools.find("add")->schema();
  EXPECT_EQ(add["type"], "function");
  EXPECT_EQ(add["function"]["description"], "Add two integers.");
  EXPECT_EQ(add["function"]["parameters"]["required"], (Json{"a", "b"}));
  EXPECT_EQ(add["function"]["parameters"]["properties"]["a"]["type"], "integer");
  EXPECT_EQ(tools.schemas().size(), 5u);
}

TEST(McpTool, CallsReturnTheServersTextAndToolErrorsAreResults) {
  const ToolSet& tools = shared_tools();
  ToolResult sum = tools.find("add")->call(Json{{"a", 2}, {"b", 40}}, nullptr);
  ASSERT_TRUE(sum.ok()) << sum.text;
  EXPECT_EQ(sum.text, "42");
  ToolResult city = tools.find("capital")->call(Json{{"country", "Peru"}}, nullptr);
  EXPECT_EQ(city.text, "Lima");
  // The tool raised: the server answers isError, which the model sees.
  ToolResult unknown = tools.find("capital")->call(Json{{"country", "Atlantis"}}, nullptr);
  EXPECT_EQ(unknown.status, ToolStatus::failed);
  EXPECT_NE(unknown.text.find("no capital known for Atlantis"), std::string::npos) << unknown.text;
  // Checked against the inputSchema before anything is sent.
  ToolResult missing = tools.find("add")->call(Json{{"a", 2}}, nullptr);
  EXPECT_EQ(missing.status, ToolStatus::invalid_arguments);
  EXPECT_NE(missing.text.find("missing required argument 'b'"), std::string::npos) << missing.text;
  ToolResult wrong_type = tools.find("add")->call(Json{{"a", "two"}, {"b", 1}}, nullptr);
  EXPECT_EQ(wrong_type.status, ToolStatus::invalid_arguments);
}

TEST(McpTool, ConcurrentCallsOfOneTurnComeBackInCallOrder) {
  const ToolSet& tools = shared_tools();
  std::vector<ToolCallRequest> calls;
  for (int i = 0; i < 6; ++i) calls.push_back({"add", Json{{"a", i}, {"b", 100}}});
  calls.push_back({"capital", Json{{"country", "japan"}}});
  ToolSetOptions options;
  options.max_parallel_calls = 4;
  auto results = tools.run(calls, nullptr, options);
  ASSERT_EQ(results.size(), calls.size());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(results[static_cast<size_t>(i)].text, std::to_string(100 + i));
  EXPECT_EQ(results[6].text, "Tokyo");
}

TEST(McpTool, AHangingServerIsATimeoutAndIsRestartedForTheNextCall) {
  const ToolSet& tools = shared_tools();
  auto start = Clock::now();
  ToolResult slow = tools.find("nap")->call(Json{{"seconds", 60}}, nullptr);
  EXPECT_LT(seconds_since(start), 10.0);
  EXPECT_EQ(slow.status, ToolStatus::timed_out) << slow.text;
  EXPECT_NE(slow.text.find("did not answer tools/call in time"), std::string::npos) << slow.text;
  ToolResult after = tools.find("add")->call(Json{{"a", 1}, {"b", 1}}, nullptr);
  ASSERT_TRUE(after.ok()) << after.text;
  EXPECT_EQ(after.text, "2");
}

TEST(McpTool, ADyingServerIsAnErrorResultAndIsRestartedForTheNextCall) {
  const ToolSet& tools = shared_tools();
  ToolResult died = tools.find("die")->call(Json::object(), nullptr);
  EXPECT_EQ(died.status, ToolStatus::failed);
  EXPECT_NE(died.text.find("closed its output before answering tools/call"), std::string::npos) << died.text;
  EXPECT_NE(died.text.find("test server exiting on purpose"), std::string::npos) << died.text;
  ToolResult after = tools.find("capital")->call(Json{{"country", "france"}}, nullptr);
  ASSERT_TRUE(after.ok()) << after.text;
  EXPECT_EQ(after.text, "Paris");
}

TEST(McpTool, AnOversizedReplyIsCutOff) {
  const ToolSet& tools = shared_tools();
  ToolResult fits = tools.find("blob")->call(Json{{"size", 1000}}, nullptr);
  EXPECT_EQ(fits.text, std::string(1000, 'x'));
  ToolResult big = tools.find("blob")->call(Json{{"size", 1000000}}, nullptr);
  EXPECT_EQ(big.status, ToolStatus::output_limit) << big.text.substr(0, 300);
  EXPECT_NE(big.text.find("more than 100000 bytes"), std::string::npos) << big.text.substr(0, 300);
  EXPECT_EQ(tools.find("add")->call(Json{{"a", 3}, {"b", 4}}, nullptr).text, "7");
}

TEST(McpTool, SelectedToolsOnly) {
  ToolSet tools = load_tool_config_from_string(mcp_config("", "    mcp:\n      tool_selected_list: [capital, add]\n"),
                                               "mcp.yaml", "");
  EXPECT_EQ(tools.names(), (std::vector<std::string>{"add", "capital"}));
  std::string msg = error_of([] {
    load_tool_config_from_string(mcp_config("", "    mcp:\n      tool_selected_list: [search]\n"), "mcp.yaml", "");
  });
  EXPECT_NE(msg.find("mcp.yaml: tools[0]: tool_selected_list names 'search'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("add, capital, nap, die, blob"), std::string::npos) << msg;
}

TEST(McpTool, ServersFileInClaudeDesktopLayout) {
  hybridflow::testing::TempDir dir;
  std::string servers = dir.file("servers.json");
  Json file = {{"mcpServers", {{"test", {{"command", python_for_tests()}, {"args", Json{server_script()}}}}}}};
  {
    std::FILE* f = std::fopen(servers.c_str(), "w");
    std::fputs(file.dump().c_str(), f);
    std::fclose(f);
  }
  std::string yaml = "tools:\n  - config: {type: mcp, startup_timeout_s: 60}\n    mcp:\n"
                     "      mcp_servers_config_path: servers.json\n      tool_selected_list: [add]\n";
  ToolSet tools = load_tool_config_from_string(yaml, "t.yaml", dir.path());
  ASSERT_EQ(tools.names(), (std::vector<std::string>{"add"}));
  EXPECT_EQ(tools.find("add")->describe(), "MCP server 'test'");
  EXPECT_EQ(tools.find("add")->call(Json{{"a", 5}, {"b", 5}}, nullptr).text, "10");
}

TEST(McpTool, AServerThatCannotStartIsALoadErrorNamingTheEntry) {
  auto start = Clock::now();
  std::string exits = error_of([] {
    load_tool_config_from_string("tools:\n  - config: {type: mcp, command: [/bin/sh, -c, 'echo broken >&2; exit 2']}\n",
                                 "bad.yaml", "");
  });
  EXPECT_NE(exits.find("bad.yaml: tools[0]: MCP server"), std::string::npos) << exits;
  EXPECT_NE(exits.find("could not be started"), std::string::npos) << exits;
  EXPECT_NE(exits.find("broken"), std::string::npos) << exits;
  std::string hangs = error_of([] {
    load_tool_config_from_string("tools:\n  - config: {type: mcp, command: [sleep, '100'], startup_timeout_s: 0.5}\n",
                                 "bad.yaml", "");
  });
  EXPECT_NE(hangs.find("did not answer initialize in time"), std::string::npos) << hangs;
  std::string not_json = error_of([] {
    load_tool_config_from_string("tools:\n  - config: {type: mcp, command: [/bin/sh, -c, 'echo hello; sleep 100']}\n",
                                 "bad.yaml", "");
  });
  EXPECT_NE(not_json.find("not JSON-RPC"), std::string::npos) << not_json;
  EXPECT_LT(seconds_since(start), 20.0);
  std::string with_schema = error_of([] {
    load_tool_config_from_string("tools:\n  - config: {type: mcp, command: [x]}\n    tool_schema: {type: function}\n",
                                 "bad.yaml", "");
  });
  EXPECT_NE(with_schema.find("takes its tools' schemas from the server"), std::string::npos) << with_schema;
}

}  // namespace
}  // namespace hybridflow::agent
