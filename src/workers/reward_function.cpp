#include "hybridflow/workers/reward_function.h"

#include "hybridflow/core/error.h"
#include "hybridflow/workers/command_reward.h"
#include "hybridflow/workers/http_reward.h"
#include "hybridflow/workers/task_reward.h"

namespace hybridflow {

const std::string kScorerKeysYaml = R"(  command: null
  shell: null
  url: null
  allowed_hosts: []
  timeout_s: 60.0
  max_output_bytes: )" + std::to_string(kDefaultRewardMaxOutputBytes) + "\n";

const std::string kRewardConfigDefaults = "reward:\n  type: task\n" + kScorerKeysYaml + "  task: null\n";

nlohmann::json reward_request_to_json(const RewardRequest& request) {
  nlohmann::json row = nlohmann::json::object();
  if (!request.extra.is_null()) {
    HF_CHECK(request.extra.is_object(), "reward request extra fields: expected a JSON object, got ",
             request.extra.type_name());
    row = request.extra;
  }
  // The named fields win over same-named extras: scorers rely on them. ground_truth repeats answer under
  // verl's name, so a verl compute_score(data_source, solution_str, ground_truth, extra_info) ports as is.
  row["prompt"] = request.prompt;
  row["response"] = request.response;
  row["answer"] = request.answer;
  row["ground_truth"] = request.answer;
  row["data_source"] = request.data_source;
  row["extra_info"] = request.extra_info;
  return row;
}

void check_reward_function_spec(const RewardFunctionSpec& spec) {
  const std::string prefix = spec.section.empty() ? "" : spec.section + ".";
  HF_CHECK(spec.max_output_bytes > 0, prefix, "max_output_bytes: expected > 0 (bytes), got ", spec.max_output_bytes);
  if (spec.type == "command") {
    HF_CHECK(spec.command.has_value() != spec.shell.has_value(), prefix, "type is 'command': set exactly one of ",
             prefix, "command (argv list) or ", prefix, "shell (command line)");
  } else if (spec.type == "http") {
    HF_CHECK(spec.url.has_value(), prefix, "type is 'http': set ", prefix, "url (http://127.0.0.1:PORT/PATH)");
  } else if (spec.type == "task") {
    HF_CHECK(spec.task.has_value(), prefix, "type is 'task': set ", prefix,
             "task (the built-in task's name, e.g. addition)");
  } else {
    HF_FAIL(prefix, "type: expected task, command or http, got '", spec.type, "'");
  }
}

std::unique_ptr<RewardFunction> make_reward_function(const RewardFunctionSpec& spec) {
  check_reward_function_spec(spec);
  if (spec.type == "command") {
    if (spec.shell) return std::make_unique<CommandReward>(CommandReward::shell(*spec.shell, spec.timeout_s, spec.max_output_bytes));
    return std::make_unique<CommandReward>(*spec.command, spec.timeout_s, spec.max_output_bytes);
  }
  if (spec.type == "http")
    return std::make_unique<HttpReward>(*spec.url, spec.timeout_s, spec.allowed_hosts, spec.max_output_bytes);
  return std::make_unique<TaskReward>(*spec.task);
}

}  // namespace hybridflow
