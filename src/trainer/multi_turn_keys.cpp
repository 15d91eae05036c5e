// actor_rollout_ref.rollout.multi_turn: verl's keys for agentic rollouts, read and checked here into the
// plain values a rollout worker's AgentRolloutRuntime (workers/agent_rollout.h) loads from. The tool and
// interaction keys go through the tool loader's reader (agent/multi_turn_config.h), so both read them alike.
#include <filesystem>

#include "hybridflow/agent/multi_turn_config.h"
#include "hybridflow/core/error.h"
#include "hybridflow/text/tokenizer_config.h"
#include "hybridflow/text/tool_calls.h"
#include "role_spec_builders.h"

namespace hybridflow {

nlohmann::json multi_turn_rollout_spec(const ConfigReader& multi_turn, const std::string& model_dir,
                                       int64_t response_length, int generation_pp, int generation_tp,
                                       const PromptOptions& prompts) {
  const std::string section = multi_turn.config().prefix();
  // All of them belong to the rollout spec, read or not (the tool loader's reader takes the Config itself).
  for (const char* key : {"max_assistant_turns", "max_user_turns", "format", "tool_config_path",
                          "interaction_config_path", "max_parallel_calls", "max_tool_response_length",
                          "tool_response_truncate_side"})
    multi_turn.note(key);
  if (!multi_turn.get<bool>("enable")) return nullptr;
  // Under tensor-parallel or staged generation rank 0 of each replica (tensor-parallel rank 0, or stage 0) runs
  // the episodes and their tools and the other ranks repeat its schedule (engine/turn_schedule.h). Both at once
  // would need the schedule relayed over two groups, which it is not.
  HF_CHECK(generation_pp == 1 || generation_tp == 1, section,
           ".enable: multi-turn rollouts run over pipeline stages or tensor-parallel ranks, not both: "
           "actor_rollout_ref.rollout.pipeline_model_parallel_size = ", generation_pp,
           " with actor_rollout_ref.rollout.tensor_model_parallel_size = ", generation_tp,
           " is refused; set one of them to 1");
  HF_CHECK(!model_dir.empty(), section,
           ".enable: multi-turn rollouts render the conversation with the model's chat template, but model.path is "
           "empty (a preset's character tokenizer has none); set model.path to a directory with tokenizer.json and "
           "tokenizer_config.json");
  const std::string config_path = model_dir + "/tokenizer_config.json";
  HF_CHECK(std::filesystem::exists(config_path), section, ".enable: ", config_path,
           " does not exist; multi-turn rollouts need the model's chat template");
  const text::TokenizerConfig tokenizer_config = text::TokenizerConfig::load(config_path);
  // Throws naming the file when it has no template (and none replaces it).
  if (prompts.custom_chat_template.empty()) (void)tokenizer_config.template_for(/*with_tools=*/true);

  nlohmann::json spec = {{"enable", true}, {"tokenizer_dir", model_dir}};
  if (!prompts.custom_chat_template.empty()) spec["chat_template"] = prompts.custom_chat_template;
  if (!prompts.chat_template_kwargs.empty()) spec["chat_template_kwargs"] = prompts.chat_template_kwargs;
  // null: no limit of their own; the response budget bounds the turns (each takes at least one token).
  for (const char* key : {"max_assistant_turns", "max_user_turns"}) {
    int64_t turns = response_length;
    if (!multi_turn.is_null(key)) {
      turns = multi_turn.get<int64_t>(key);
      HF_CHECK(turns >= 1, section, ".", key, " must be >= 1 (or null: no limit but the response length), got ",
               turns);
    }
    spec[key] = std::min<int64_t>(turns, 1 << 20);
  }
  const std::string format = multi_turn.get<std::string>("format");
  try {
    (void)text::tool_call_format_from_name(format);
  } catch (const Error&) {
    throw Error(section + ".format: expected hermes (Qwen2.5 / Qwen3 <tool_call> JSON) or llama3_json (Llama 3.1 "
                "JSON calls), got '" + format + "'");
  }
  spec["format"] = format;

  const agent::MultiTurnToolConfig tools = agent::read_multi_turn_tool_config(multi_turn.config());
  for (const auto& [key, path] : {std::pair<const char*, std::string>{"tool_config_path", tools.tool_config_path},
                                  {"interaction_config_path", tools.interaction_config_path}}) {
    if (path.empty()) continue;
    HF_CHECK(std::filesystem::exists(path), section, ".", key, ": ", path, " does not exist");
    spec[key] = path;
  }
  spec["max_parallel_calls"] = tools.options.max_parallel_calls;
  spec["max_tool_response_length"] = tools.options.max_tool_response_length;
  spec["tool_response_truncate_side"] = agent::truncate_side_name(tools.options.truncate_side);
  return spec;
}

}  // namespace hybridflow
