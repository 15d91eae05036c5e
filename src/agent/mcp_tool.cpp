#include "hybridflow/agent/mcp_tool.h"

#include "hybridflow/core/error.h"

namespace hybridflow::agent {
namespace mcp_detail {

// The protocol revision we speak; servers answer with theirs and we accept any (the four methods used
// here are the same in every revision).
constexpr const char* kProtocolVersion = "2025-06-18";

std::chrono::steady_clock::time_point deadline_after(double seconds) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
}

std::string clip_line(const std::string& s, size_t max = 300) { return s.size() <= max ? s : s.substr(0, max) + "..."; }

// The text of a tools/call result's content list, for the model.
std::string content_text(const Json& result) {
  std::string text;
  auto add = [&](const std::string& piece) { text += (text.empty() ? "" : "\n") + piece; };
  if (result.contains("content") && result["content"].is_array()) {
    for (const auto& item : result["content"]) {
      std::string type = item.is_object() ? item.value("type", "") : "";
      if (type == "text" && item.contains("text") && item["text"].is_string()) {
        add(item["text"].get<std::string>());
      } else if (type == "resource" && item.contains("resource") && item["resource"].is_object() &&
                 item["resource"].contains("text") && item["resource"]["text"].is_string()) {
        add(item["resource"]["text"].get<std::string>());
      } else {
        add("[" + (type.empty() ? std::string("unknown") : type) + " content not shown]");
      }
    }
  }
  if (text.empty() && result.contains("structuredContent")) text = result["structuredContent"].dump();
  return text;
}

}  // namespace mcp_detail

using namespace mcp_detail;

McpServer::McpServer(McpServerSpec spec) : spec_(std::move(spec)) {
  HF_CHECK(!spec_.argv.empty() && !spec_.argv[0].empty(), "MCP server '", spec_.name, "': empty command");
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    auto deadline = deadline_after(spec_.startup_timeout_s);
    start_locked(deadline);
    std::string cursor;
    do {
      Json params = Json::object();
      if (!cursor.empty()) params["cursor"] = cursor;
      Json page = request_locked("tools/list", params, deadline);
      HF_CHECK(page.contains("tools") && page["tools"].is_array(), "MCP server '", spec_.name,
               "': tools/list answered without a tools list: ", clip_line(page.dump()));
      for (const auto& tool : page["tools"]) listed_.push_back(tool);
      cursor = page.contains("nextCursor") && page["nextCursor"].is_string() ? page["nextCursor"].get<std::string>() : "";
    } while (!cursor.empty());
  } catch (const Failure& failure) {
    if (process_) process_->kill();
    HF_FAIL("MCP server '", spec_.name, "' could not be started: ", failure.message);
  }
}

McpServer::~McpServer() = default;

void McpServer::fail_locked(ToolStatus status, const std::string& what) {
  std::string message = "MCP server '" + spec_.name + "' " + what;
  if (process_) {
    if (status == ToolStatus::failed) process_->drain_stderr(deadline_after(0.5));
    std::string ended = process_->exit_description();
    if (!ended.empty()) message += " (it " + ended + ")";
    std::string tail = process_->stderr_tail();
    if (!tail.empty()) message += "; stderr: " + clip_line(tail, 1000);
    process_->kill();
    process_.reset();  // started again by the next call
  }
  throw Failure{status, message};
}

void McpServer::start_locked(Clock::time_point deadline) {
  SubprocessOptions options;
  options.extra_env = spec_.env;
  options.working_dir = spec_.working_dir;
  try {
    process_ = std::make_unique<PipedProcess>(spec_.argv, options);
  } catch (const Error& e) {
    throw Failure{ToolStatus::failed, e.what()};
  }
  Json params = {{"protocolVersion", kProtocolVersion},
                 {"capabilities", Json::object()},
                 {"clientInfo", {{"name", "hybridflow"}, {"version", "0.1"}}}};
  Json init = request_locked("initialize", params, deadline);
  if (!init.contains("protocolVersion")) fail_locked(ToolStatus::failed, "answered initialize without a protocolVersion");
  notify_locked("notifications/initialized", deadline);
}

void McpServer::notify_locked(const std::string& method, Clock::time_point deadline) {
  Json message = {{"jsonrpc", "2.0"}, {"method", method}};
  auto io = process_->write_all(message.dump() + "\n", deadline);
  if (io == PipedProcess::Io::timed_out) fail_locked(ToolStatus::timed_out, "did not read " + method + " in time");
  if (io != PipedProcess::Io::ok) fail_locked(ToolStatus::failed, "stopped reading its input");
}

Json McpServer::request_locked(const std::string& method, const Json& params, Clock::time_point deadline) {
  int64_t id = next_id_++;
  Json message = {{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}};
  auto io = process_->write_all(message.dump() + "\n", deadline);
  if (io == PipedProcess::Io::timed_out) fail_locked(ToolStatus::timed_out, "did not read the " + method + " request in time");
  if (io != PipedProcess::Io::ok) fail_locked(ToolStatus::failed, "stopped reading its input");
  const size_t max_line = static_cast<size_t>(spec_.bounds.max_output_bytes);
  while (true) {
    std::string line;
    io = process_->read_line(line, deadline, max_line);
    if (io == PipedProcess::Io::timed_out) fail_locked(ToolStatus::timed_out, "did not answer " + method + " in time");
    if (io == PipedProcess::Io::too_long)
      fail_locked(ToolStatus::output_limit,
                  "sent a message of more than " + std::to_string(max_line) + " bytes (max_output_bytes)");
    if (io == PipedProcess::Io::closed) fail_locked(ToolStatus::failed, "closed its output before answering " + method);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Json reply;
    try {
      reply = Json::parse(line);
    } catch (const Json::parse_error&) {
      fail_locked(ToolStatus::failed, "wrote a line that is not JSON-RPC to stdout: '" + clip_line(line) + "'");
    }
    if (!reply.is_object()) continue;
    bool has_id = reply.contains("id") && !reply["id"].is_null();
    if (reply.contains("method")) {
      // A request from the server (ping, roots/list, sampling): answered so it does not wait on us.
      if (has_id) {
        Json answer = {{"jsonrpc", "2.0"}, {"id", reply["id"]}};
        if (reply["method"] == "ping")
          answer["result"] = Json::object();
        else
          answer["error"] = {{"code", -32601}, {"message", "method not supported by this client"}};
        process_->write_all(answer.dump() + "\n", deadline);
      }
      continue;  // notifications (logging, progress) are not needed here
    }
    if (!has_id || reply["id"] != id) continue;  // an answer to a request we gave up on
    if (reply.contains("error")) {
      const Json& error = reply["error"];
      std::string text = error.is_object() && error.contains("message") && error["message"].is_string()
                             ? error["message"].get<std::string>()
                             : error.dump();
      throw Failure{ToolStatus::failed, "MCP server '" + spec_.name + "' refused " + method + ": " + text};
    }
    return reply.contains("result") ? reply["result"] : Json::object();
  }
}

ToolResult McpServer::call_tool(const std::string& name, const Json& arguments) {
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    if (!process_) start_locked(deadline_after(spec_.startup_timeout_s));
    Json result = request_locked("tools/call", {{"name", name}, {"arguments", arguments}},
                                 deadline_after(spec_.bounds.timeout_s));
    std::string text = content_text(result);
    if (result.value("isError", false)) return ToolResult::error(ToolStatus::failed, text);
    ToolResult ok;
    ok.text = text;
    return ok;
  } catch (const Failure& failure) {
    return ToolResult::error(failure.status, failure.message);
  }
}

McpTool::McpTool(std::shared_ptr<McpServer> server, const Json& listed_tool, const std::string& where)
    : Tool(
          [&] {
            HF_CHECK(listed_tool.is_object() && listed_tool.contains("name") && listed_tool["name"].is_string(),
                     where, ": the server listed a tool without a name: ", clip_line(listed_tool.dump()));
            Json function = {{"name", listed_tool["name"]}};
            if (listed_tool.contains("description")) function["description"] = listed_tool["description"];
            function["parameters"] = listed_tool.contains("inputSchema") ? listed_tool["inputSchema"]
                                                                         : Json{{"type", "object"}, {"properties", Json::object()}};
            return Json{{"type", "function"}, {"function", function}};
          }(),
          where),
      server_(std::move(server)) {}

std::string McpTool::describe() const { return "MCP server '" + server_->spec().name + "'"; }

ToolResult McpTool::run(const Json& arguments, const Json& /*kwargs*/) const {
  return server_->call_tool(name(), arguments);
}

std::vector<std::shared_ptr<const Tool>> mcp_tools(const std::shared_ptr<McpServer>& server,
                                                   const std::vector<std::string>& selected,
                                                   const std::string& where) {
  std::vector<std::shared_ptr<const Tool>> tools;
  std::string listed_names;
  for (const auto& listed : server->listed_tools()) {
    auto tool = std::make_shared<McpTool>(server, listed, where);
    listed_names += (listed_names.empty() ? "" : ", ") + tool->name();
    bool wanted = selected.empty();
    for (const auto& s : selected) wanted = wanted || s == tool->name();
    if (wanted) tools.push_back(std::move(tool));
  }
  for (const auto& s : selected) {
    bool found = false;
    for (const auto& t : tools) found = found || t->name() == s;
    HF_CHECK(found, where, ": tool_selected_list names '", s, "', which MCP server '", server->spec().name,
             "' does not list (it lists: ", listed_names.empty() ? "nothing" : listed_names, ")");
  }
  return tools;
}

}  // namespace hybridflow::agent
