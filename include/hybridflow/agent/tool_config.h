// The tool configuration file, in verl's layout (YAML, or JSON):
//
//   tools:
//     - class_name: ...            # verl's Python class; optional, not used
//       config: {type: command, command: [python3, calc.py], timeout_s: 10, max_output_bytes: 65536}
//       tool_schema: {type: function, function: {name: ..., description: ..., parameters: {...}}}
//
// config.type: command | http | mcp | python (docs/agentic.md lists each kind's keys). Errors name the
// file, the entry (tools[i] and its name), the key and its line.
#pragma once

#include <string>

#include "hybridflow/agent/tool_set.h"

namespace hybridflow::agent {

// Loads every tool (MCP servers are started and their tools listed); throws hybridflow::Error.
ToolSet load_tool_config(const std::string& path);
// The same from text; `source_name` stands for the file in messages and relative paths resolve against
// `base_dir`.
ToolSet load_tool_config_from_string(const std::string& text, const std::string& source_name,
                                     const std::string& base_dir);

}  // namespace hybridflow::agent
