// Tools of a Model Context Protocol server run as a subprocess over stdio (newline-delimited JSON-RPC
// 2.0). At start: initialize, notifications/initialized, tools/list (all pages); each listed tool becomes
// a Tool whose parameters are the tool's inputSchema. Each call is a tools/call.
//
// One server process is shared by its tools and spoken to one request at a time. A server that exits,
// writes a line longer than max_output_bytes or does not answer within timeout_s gives an error result;
// it is killed (its process group) and started again on the next call.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "hybridflow/agent/command_tool.h"
#include "hybridflow/agent/tool.h"
#include "hybridflow/core/subprocess.h"

namespace hybridflow::agent {

struct McpServerSpec {
  std::string name;  // for messages: the config entry or the mcpServers key
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;  // added to the inherited environment
  ProcessBounds bounds;                                   // per call; max_output_bytes bounds one reply
  double startup_timeout_s = 30;                          // start, initialize and tools/list
  std::string working_dir;                                // "" = the trainer's
};

class McpServer {
 public:
  // Starts the server and lists its tools; throws hybridflow::Error naming the server and what failed.
  explicit McpServer(McpServerSpec spec);
  ~McpServer();
  const McpServerSpec& spec() const { return spec_; }
  // The tools/list entries, as the server sent them.
  const std::vector<Json>& listed_tools() const { return listed_; }
  // One tools/call; never throws.
  ToolResult call_tool(const std::string& name, const Json& arguments);

 private:
  using Clock = std::chrono::steady_clock;
  struct Failure {
    ToolStatus status;
    std::string message;
  };
  void start_locked(Clock::time_point deadline);  // throws Failure
  Json request_locked(const std::string& method, const Json& params, Clock::time_point deadline);  // throws Failure
  void notify_locked(const std::string& method, Clock::time_point deadline);
  [[noreturn]] void fail_locked(ToolStatus status, const std::string& what);

  McpServerSpec spec_;
  std::mutex mutex_;
  std::unique_ptr<PipedProcess> process_;
  int64_t next_id_ = 1;
  std::vector<Json> listed_;
};

class McpTool : public Tool {
 public:
  McpTool(std::shared_ptr<McpServer> server, const Json& listed_tool, const std::string& where);
  std::string describe() const override;

 protected:
  ToolResult run(const Json& arguments, const Json& kwargs) const override;

 private:
  std::shared_ptr<McpServer> server_;
};

// The tools of a started server (those in `selected` when it is not empty; a selected name the server
// does not list is an Error naming `where`).
std::vector<std::shared_ptr<const Tool>> mcp_tools(const std::shared_ptr<McpServer>& server,
                                                   const std::vector<std::string>& selected,
                                                   const std::string& where);

}  // namespace hybridflow::agent
