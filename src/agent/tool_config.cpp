#include "hybridflow/agent/tool_config.h"

#include <filesystem>

#include "config_entry.h"
#include "hybridflow/agent/command_tool.h"
#include "hybridflow/agent/http_tool.h"
#include "hybridflow/agent/mcp_tool.h"
#include "hybridflow/agent/python_tool.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"

namespace hybridflow::agent {
namespace tool_config_detail {

ProcessBounds read_bounds(const ConfigEntry& config, ProcessBounds defaults) {
  ProcessBounds bounds;
  bounds.timeout_s = config.number_or("timeout_s", defaults.timeout_s);
  bounds.max_output_bytes = config.integer_or("max_output_bytes", defaults.max_output_bytes);
  if (!(bounds.timeout_s > 0)) config.fail("timeout_s", "expected a number > 0");
  if (bounds.max_output_bytes <= 0) config.fail("max_output_bytes", "expected an integer > 0");
  return bounds;
}

Json read_schema(const ConfigEntry& entry) {
  if (!entry.has("tool_schema")) entry.fail("tool_schema", "missing: this kind of tool needs an OpenAI function schema");
  return yaml_to_json(entry.node()["tool_schema"]);
}

std::vector<std::pair<std::string, std::string>> read_env(const ConfigEntry& config, const std::string& key) {
  std::vector<std::pair<std::string, std::string>> env;
  if (!config.has(key)) return env;
  if (!config.node()[key].IsMap()) config.fail(key, "expected a map of environment variables");
  for (const auto& kv : config.node()[key]) {
    if (!kv.second.IsScalar()) config.fail(key, "the value of '" + kv.first.as<std::string>() + "' must be a string");
    env.emplace_back(kv.first.as<std::string>(), kv.second.Scalar());
  }
  return env;
}

// An MCP servers file as Claude Desktop and verl write it: {"mcpServers": {name: {command, args, env}}}.
std::vector<McpServerSpec> read_mcp_servers_file(const std::string& path, const ConfigEntry& entry,
                                                 ProcessBounds bounds, double startup_timeout_s) {
  std::string text;
  try {
    text = read_file(path);
  } catch (const Error& e) {
    entry.fail("mcp", std::string("mcp_servers_config_path: ") + e.what());
  }
  Json file;
  try {
    file = Json::parse(text);
  } catch (const Json::parse_error& e) {
    HF_FAIL(path, ": not valid JSON: ", e.what());
  }
  HF_CHECK(file.is_object() && file.contains("mcpServers") && file["mcpServers"].is_object(), path,
           ": expected {\"mcpServers\": {name: {\"command\": ..., \"args\": [...]}}}");
  std::vector<McpServerSpec> specs;
  for (const auto& [name, server] : file["mcpServers"].items()) {
    HF_CHECK(server.is_object(), path, ": mcpServers.", name, ": expected a map");
    HF_CHECK(!server.contains("url"), path, ": mcpServers.", name,
             ": a server reached by url is not supported; only servers started as a command (stdio)");
    HF_CHECK(server.contains("command") && server["command"].is_string(), path, ": mcpServers.", name,
             ".command: expected the program to start (a string)");
    McpServerSpec spec;
    spec.name = name;
    spec.argv.push_back(server["command"].get<std::string>());
    if (server.contains("args")) {
      HF_CHECK(server["args"].is_array(), path, ": mcpServers.", name, ".args: expected a list of strings");
      for (const auto& a : server["args"]) {
        HF_CHECK(a.is_string(), path, ": mcpServers.", name, ".args: expected strings, got ", a.dump());
        spec.argv.push_back(a.get<std::string>());
      }
    }
    if (server.contains("env") && server["env"].is_object())
      for (const auto& [k, v] : server["env"].items())
        spec.env.emplace_back(k, v.is_string() ? v.get<std::string>() : v.dump());
    spec.bounds = bounds;
    spec.startup_timeout_s = startup_timeout_s;
    spec.working_dir = std::filesystem::path(path).parent_path().string();
    specs.push_back(std::move(spec));
  }
  return specs;
}

void add_tool_entry(ToolSet& set, const ConfigEntry& entry, const std::string& base_dir) {
  entry.check_keys({"class_name", "config", "tool_schema", "mcp"});
  ConfigEntry config = entry.config_of_kind("command, http, mcp or python");
  std::string type = config.string_or("type", "");
  const std::string& where = entry.where();
  if (type == "command") {
    config.check_keys({"type", "command", "timeout_s", "max_output_bytes"});
    // Run in the config file's directory, so that `[python3, calc.py]` beside the file works.
    auto tool = std::make_shared<CommandTool>(read_schema(entry), config.command("command"),
                                              read_bounds(config, {30, 1 << 20}), where, base_dir);
    set.add(tool, where);
  } else if (type == "http") {
    config.check_keys({"type", "url", "timeout_s", "max_output_bytes", "allowed_hosts"});
    auto tool = std::make_shared<HttpTool>(read_schema(entry), config.string("url"), read_bounds(config, {30, 1 << 20}),
                                           config.strings_or("allowed_hosts", {}), where);
    set.add(tool, where);
  } else if (type == "python") {
    config.check_keys({"type", "timeout_s", "cpu_time_s", "memory_mb", "max_processes", "max_file_mb",
                       "max_output_bytes", "python", "ro_paths", "code_argument"});
    PythonSandboxLimits limits;
    limits.timeout_s = config.number_or("timeout_s", limits.timeout_s);
    limits.cpu_time_s = config.integer_or("cpu_time_s", limits.cpu_time_s);
    limits.memory_mb = config.integer_or("memory_mb", limits.memory_mb);
    limits.max_processes = config.integer_or("max_processes", limits.max_processes);
    limits.max_file_mb = config.integer_or("max_file_mb", limits.max_file_mb);
    limits.max_output_bytes = config.integer_or("max_output_bytes", limits.max_output_bytes);
    limits.python = config.string_or("python", limits.python);
    for (const auto& p : config.strings_or("ro_paths", {})) limits.ro_paths.push_back(resolve_config_path(p, base_dir));
    Json schema = entry.has("tool_schema") ? yaml_to_json(entry.node()["tool_schema"]) : Json();
    auto tool = std::make_shared<PythonTool>(std::move(schema), limits, config.string_or("code_argument", "code"), where);
    set.add(tool, where);
  } else if (type == "mcp") {
    config.check_keys({"type", "command", "env", "timeout_s", "startup_timeout_s", "max_output_bytes"});
    if (entry.has("tool_schema"))
      entry.fail("tool_schema", "an mcp entry takes its tools' schemas from the server (tools/list); remove it");
    ProcessBounds bounds = read_bounds(config, {60, 1 << 20});
    double startup = config.number_or("startup_timeout_s", 30);
    if (!(startup > 0)) config.fail("startup_timeout_s", "expected a number > 0");
    std::vector<std::string> selected;
    std::vector<McpServerSpec> specs;
    std::string servers_file;
    if (entry.has("mcp")) {
      ConfigEntry mcp = entry.map("mcp");
      mcp.check_keys({"mcp_servers_config_path", "tool_selected_list"});
      selected = mcp.strings_or("tool_selected_list", {});
      servers_file = mcp.string_or("mcp_servers_config_path", "");
    }
    if (!servers_file.empty()) {
      if (config.has("command"))
        config.fail("command", "give either config.command or mcp.mcp_servers_config_path, not both");
      specs = read_mcp_servers_file(resolve_config_path(servers_file, base_dir), entry, bounds, startup);
    } else {
      McpServerSpec spec;
      spec.name = where;
      spec.argv = config.command("command");
      spec.env = read_env(config, "env");
      spec.bounds = bounds;
      spec.startup_timeout_s = startup;
      spec.working_dir = base_dir;
      specs.push_back(std::move(spec));
    }
    for (auto& spec : specs) {
      std::shared_ptr<McpServer> server;
      try {
        server = std::make_shared<McpServer>(spec);
      } catch (const Error& e) {
        HF_FAIL(where, ": ", e.what());
      }
      for (auto& tool : mcp_tools(server, selected, where)) set.add(tool, where);
    }
  } else if (type == "native" || type.empty()) {
    std::string class_name = entry.string_or("class_name", "");
    config.fail("type", "expected command, http, mcp or python" +
                            (class_name.empty() ? std::string(", got '" + type + "'")
                                                : "; class_name '" + class_name +
                                                      "' names a Python class, which hybridflow cannot run: serve it "
                                                      "as a command, over http or as an MCP server"));
  } else {
    config.fail("type", "expected command, http, mcp or python, got '" + type + "'");
  }
}

}  // namespace tool_config_detail

using namespace tool_config_detail;

ToolSet load_tool_config_from_string(const std::string& text, const std::string& source_name,
                                     const std::string& base_dir) {
  YAML::Node root = parse_config_yaml(text, source_name);
  ToolSet set;
  std::vector<YAML::Node> entries = config_entries(root, "tools", source_name);
  for (size_t i = 0; i < entries.size(); ++i) {
    std::string where = source_name + ": tools[" + std::to_string(i) + "]";
    const YAML::Node& node = entries[i];
    if (node.IsMap() && node["tool_schema"] && node["tool_schema"]["function"] &&
        node["tool_schema"]["function"]["name"] && node["tool_schema"]["function"]["name"].IsScalar())
      where += " ('" + node["tool_schema"]["function"]["name"].Scalar() + "')";
    if (!node.IsMap()) HF_FAIL(where, ": expected a map with config and tool_schema");
    add_tool_entry(set, ConfigEntry(node, where), base_dir);
  }
  return set;
}

ToolSet load_tool_config(const std::string& path) {
  ConfigFile file = read_config_file(path, "tool config");
  return load_tool_config_from_string(file.text, path, file.base_dir);
}

}  // namespace hybridflow::agent
