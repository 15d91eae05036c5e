// The keys of actor_rollout_ref.rollout.multi_turn that configure tools and interactions (verl's names):
// tool_config_path, interaction_config_path, max_parallel_calls, max_tool_response_length,
// tool_response_truncate_side. The rollout loop reads the others (enable, turn limits, format).
#pragma once

#include <string>

#include "hybridflow/agent/interaction.h"
#include "hybridflow/agent/tool_set.h"
#include "hybridflow/core/config.h"

namespace hybridflow::agent {

struct MultiTurnToolConfig {
  std::string tool_config_path;         // "" (or null): no tools
  std::string interaction_config_path;  // "" (or null): no interaction
  ToolSetOptions options;
};

// Reads the keys from the multi_turn map (a missing or null key keeps its default); values out of range
// are an Error naming the dotted key and where it was set.
MultiTurnToolConfig read_multi_turn_tool_config(const Config& multi_turn);

// The tools and interactions a MultiTurnToolConfig names, loaded.
struct AgentEnvironment {
  ToolSet tools;
  Interactions interactions;
  ToolSetOptions options;
};
AgentEnvironment load_agent_environment(const MultiTurnToolConfig& config);

}  // namespace hybridflow::agent
