#include "hybridflow/agent/agent_loop.h"

#include <algorithm>

#include "hybridflow/core/error.h"

namespace hybridflow::agent {

const char* episode_stop_name(EpisodeStop stop) {
  switch (stop) {
    case EpisodeStop::answered: return "answered";
    case EpisodeStop::interaction_done: return "interaction_done";
    case EpisodeStop::max_assistant_turns: return "max_assistant_turns";
    case EpisodeStop::max_user_turns: return "max_user_turns";
    case EpisodeStop::response_length: return "response_length";
    case EpisodeStop::interaction_failed: return "interaction_failed";
  }
  return "?";
}

Json assistant_message(const text::ParsedToolCalls& parsed, text::ToolCallFormat format) {
  Json message = {{"role", "assistant"}};
  bool has_calls = !parsed.calls.empty();
  // Hermes: the text around the calls; Llama 3 JSON: the whole text when it is not a call.
  message["content"] = format == text::ToolCallFormat::hermes || !has_calls ? parsed.content : std::string();
  if (has_calls) {
    message["tool_calls"] = Json::array();
    for (const auto& call : parsed.calls)
      message["tool_calls"].push_back({{"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
  }
  return message;
}

namespace agent_loop_detail {

// One tool message per call attempt, in the order the model wrote them: results of the well-formed
// calls and the parse errors of the malformed ones.
Json tool_messages(const text::ParsedToolCalls& parsed, const std::vector<ToolResult>& results) {
  struct Item {
    size_t begin;
    std::string text;
  };
  std::vector<Item> items;
  for (size_t i = 0; i < parsed.calls.size(); ++i) items.push_back({parsed.calls[i].begin, results[i].text});
  for (const auto& error : parsed.errors) items.push_back({error.begin, "Error: " + error.message});
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.begin < b.begin; });
  Json messages = Json::array();
  for (const auto& item : items) messages.push_back({{"role", "tool"}, {"content", item.text}});
  return messages;
}

void count_results(EpisodeStats& stats, const std::vector<ToolCallRequest>& calls, const std::vector<ToolResult>& results) {
  for (size_t i = 0; i < calls.size(); ++i) {
    ToolCallCounts& counts = stats.per_tool[calls[i].name];
    ++counts.calls;
    counts.seconds += results[i].seconds;
    ++stats.tool_calls;
    if (!results[i].ok()) {
      ++counts.errors[tool_status_name(results[i].status)];
      ++stats.tool_errors;
    }
  }
}

}  // namespace agent_loop_detail

using namespace agent_loop_detail;

Episode run_episode(TrajectoryBuilder& builder, const text::Tokenizer& tokenizer, const Json& prompt_messages,
                    const TurnSampler& sample, const EpisodeSetup& setup) {
  HF_CHECK(setup.limits.max_assistant_turns >= 1, "agent loop: max_assistant_turns must be >= 1");
  HF_CHECK(setup.limits.max_response_tokens >= 1, "agent loop: max_response_tokens must be >= 1");
  static const ToolSet no_tools;
  const ToolSet& tools = setup.tools != nullptr ? *setup.tools : no_tools;
  EpisodeStats stats;
  builder.start(prompt_messages);
  auto response_size = [&] { return static_cast<int64_t>(builder.trajectory().response_ids.size()); };
  auto context = [&] {
    std::vector<int32_t> ids = builder.trajectory().prompt_ids;
    ids.insert(ids.end(), builder.trajectory().response_ids.begin(), builder.trajectory().response_ids.end());
    return ids;
  };
  // Appends new messages if their delta fits the budget; false (and nothing appended) when it does not.
  auto append_if_fits = [&](const Json& messages) {
    std::vector<int32_t> delta = builder.delta_ids(messages);
    // The next turn needs at least one token of its own.
    if (response_size() + static_cast<int64_t>(delta.size()) >= setup.limits.max_response_tokens) return false;
    builder.append_messages(messages);
    stats.appended_tokens += static_cast<int64_t>(delta.size());
    return true;
  };
  while (true) {
    int64_t left = setup.limits.max_response_tokens - response_size();
    std::vector<int32_t> ids = sample(context(), left);
    HF_CHECK(static_cast<int64_t>(ids.size()) <= left, "agent loop: the sampler returned ", ids.size(),
             " ids where at most ", left, " were allowed");
    bool ended = !ids.empty() && tokenizer.is_special(ids.back());
    std::string text = tokenizer.decode(ended ? std::vector<int32_t>(ids.begin(), ids.end() - 1) : ids, false);
    text::ParsedToolCalls parsed = text::parse_tool_calls(text, setup.format);
    builder.append_sampled(ids, assistant_message(parsed, setup.format));
    stats.sampled_tokens += static_cast<int64_t>(ids.size());
    ++stats.assistant_turns;
    if (!ended) {
      stats.stop = EpisodeStop::response_length;  // cut off: nothing may follow it
      break;
    }
    bool wants_tools = !parsed.calls.empty() || !parsed.errors.empty();
    if (wants_tools) {
      if (stats.assistant_turns >= setup.limits.max_assistant_turns) {
        stats.stop = EpisodeStop::max_assistant_turns;
        break;
      }
      std::vector<ToolCallRequest> calls;
      for (const auto& call : parsed.calls) calls.push_back({call.name, call.arguments});
      std::vector<ToolResult> results = tools.run(calls, setup.tools_kwargs, setup.tool_options);
      count_results(stats, calls, results);
      stats.malformed_calls += static_cast<int64_t>(parsed.errors.size());
      if (!append_if_fits(tool_messages(parsed, results))) {
        stats.stop = EpisodeStop::response_length;
        break;
      }
      continue;
    }
    if (setup.interaction == nullptr) {
      stats.stop = EpisodeStop::answered;
      break;
    }
    InteractionTurn turn = setup.interaction->respond(builder.trajectory().messages, setup.interaction_kwargs);
    if (turn.reward) stats.interaction_rewards.push_back(*turn.reward);
    if (!turn.error.empty()) {
      stats.interaction_error = turn.error;
      stats.stop = EpisodeStop::interaction_failed;
      break;
    }
    if (turn.done) {
      stats.stop = EpisodeStop::interaction_done;
      break;
    }
    if (stats.user_turns >= setup.limits.max_user_turns) {
      stats.stop = EpisodeStop::max_user_turns;
      break;
    }
    if (!append_if_fits(Json::array({{{"role", "user"}, {"content", turn.message}}}))) {
      stats.stop = EpisodeStop::response_length;
      break;
    }
    ++stats.user_turns;
  }
  return {builder.trajectory(), stats};
}

}  // namespace hybridflow::agent
