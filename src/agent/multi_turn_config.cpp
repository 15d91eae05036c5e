#include "hybridflow/agent/multi_turn_config.h"

#include "hybridflow/agent/tool_config.h"
#include "hybridflow/core/error.h"

namespace hybridflow::agent {

MultiTurnToolConfig read_multi_turn_tool_config(const Config& multi_turn) {
  MultiTurnToolConfig out;
  auto where = [&](const std::string& name) {
    std::string full = multi_turn.prefix().empty() ? name : multi_turn.prefix() + "." + name;
    return full + " (" + multi_turn.origin(name) + ")";
  };
  out.tool_config_path = multi_turn.get_or<std::string>("tool_config_path", "");
  out.interaction_config_path = multi_turn.get_or<std::string>("interaction_config_path", "");
  ToolSetOptions& options = out.options;
  options.max_parallel_calls = static_cast<int>(multi_turn.get_or<int64_t>("max_parallel_calls", options.max_parallel_calls));
  HF_CHECK(options.max_parallel_calls >= 1 && options.max_parallel_calls <= 1024, where("max_parallel_calls"),
           ": expected an integer from 1 to 1024, got ", options.max_parallel_calls);
  options.max_tool_response_length =
      multi_turn.get_or<int64_t>("max_tool_response_length", options.max_tool_response_length);
  HF_CHECK(options.max_tool_response_length > 0, where("max_tool_response_length"),
           ": expected a number of characters > 0, got ", options.max_tool_response_length);
  if (multi_turn.has("tool_response_truncate_side") && !multi_turn.is_null("tool_response_truncate_side"))
    options.truncate_side = truncate_side_from_name(multi_turn.get<std::string>("tool_response_truncate_side"),
                                                    where("tool_response_truncate_side"));
  return out;
}

AgentEnvironment load_agent_environment(const MultiTurnToolConfig& config) {
  AgentEnvironment environment;
  if (!config.tool_config_path.empty()) environment.tools = load_tool_config(config.tool_config_path);
  if (!config.interaction_config_path.empty())
    environment.interactions = load_interaction_config(config.interaction_config_path);
  environment.options = config.options;
  return environment;
}

}  // namespace hybridflow::agent
