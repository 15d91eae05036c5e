// One agentic episode, independent of how tokens are sampled: sample an assistant turn, parse its tool
// calls, run them (one turn's calls concurrently), append the results, or ask the interaction for the
// next user turn, until the model answers without a call, the interaction is done, or a limit is hit.
// The trajectory is built by a TrajectoryBuilder, so its ids are exactly the sampled ones plus template
// deltas, with the response mask 1 only on sampled ids.
//
// A malformed call (bad JSON, no name, unclosed tag), an unknown tool, wrong arguments, a tool error, a
// timeout or an oversized result each becomes a tool message the model sees and is counted; none stops
// the episode. The response never exceeds max_response_tokens: the sampler is given what is left, and a
// tool or user turn that would not fit ends the episode before it is appended.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "hybridflow/agent/interaction.h"
#include "hybridflow/agent/tool_set.h"
#include "hybridflow/agent/trajectory.h"
#include "hybridflow/text/tool_calls.h"

namespace hybridflow::agent {

struct AgentLoopLimits {
  int max_assistant_turns = 5;      // verl's multi_turn.max_assistant_turns
  int max_user_turns = 5;           // verl's multi_turn.max_user_turns (interaction turns)
  int64_t max_response_tokens = 1024;  // everything after the prompt: sampled and appended
};

// Samples one assistant turn continuing `context` (the prompt and the response so far): at most
// max_new_tokens ids, ending with an end-of-turn token unless cut off by that limit.
using TurnSampler = std::function<std::vector<int32_t>(const std::vector<int32_t>& context, int64_t max_new_tokens)>;

enum class EpisodeStop {
  answered,              // an assistant turn without tool calls, and no interaction
  interaction_done,      // the interaction said done
  max_assistant_turns,   // the model still called tools after the last allowed turn
  max_user_turns,        // the interaction wanted another turn after the last allowed one
  response_length,       // the response budget ran out (a turn cut off, or the next delta would not fit)
  interaction_failed,    // the interaction failed (its error is recorded)
};
const char* episode_stop_name(EpisodeStop stop);

struct ToolCallCounts {
  int64_t calls = 0;
  std::map<std::string, int64_t> errors;  // by tool_status_name
  double seconds = 0;                     // summed over calls
};

struct EpisodeStats {
  int assistant_turns = 0;
  int user_turns = 0;
  int64_t tool_calls = 0;       // well-formed calls run (unknown tools included)
  int64_t tool_errors = 0;      // calls whose result was an error
  int64_t malformed_calls = 0;  // calls that could not be parsed from the text
  std::map<std::string, ToolCallCounts> per_tool;
  std::vector<double> interaction_rewards;  // each turn's reward the interaction gave
  std::string interaction_error;
  int64_t sampled_tokens = 0;
  int64_t appended_tokens = 0;
  EpisodeStop stop = EpisodeStop::answered;
};

struct Episode {
  Trajectory trajectory;
  EpisodeStats stats;
};

struct EpisodeSetup {
  const ToolSet* tools = nullptr;              // null: no tools (calls become unknown-tool errors)
  ToolSetOptions tool_options;
  text::ToolCallFormat format = text::ToolCallFormat::hermes;
  const Interaction* interaction = nullptr;    // null: the episode ends at the first answer without calls
  Json tools_kwargs;                           // the row's tools_kwargs
  Json interaction_kwargs;                     // the row's interaction_kwargs
  AgentLoopLimits limits;
  // Further chat template variables (data.apply_chat_template_kwargs: Qwen3's enable_thinking, ...).
  Json template_variables = Json::object();
};

// `builder` renders with the same tools the sampler's model was prompted with.
Episode run_episode(TrajectoryBuilder& builder, const text::Tokenizer& tokenizer, const Json& prompt_messages,
                    const TurnSampler& sample, const EpisodeSetup& setup);

// The assistant message of a sampled turn, from its parsed text: content and tool_calls as the chat
// templates take them.
Json assistant_message(const text::ParsedToolCalls& parsed, text::ToolCallFormat format);

}  // namespace hybridflow::agent
