#include "hybridflow/workers/reward_function.h"

#include "hybridflow/core/config.h"
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

std::unique_ptr<RewardFunction> make_reward_function(const Config& reward) {
  const std::string prefix = reward.prefix().empty() ? "" : reward.prefix() + ".";
  const std::string type = reward.get<std::string>("type");
  const double timeout_s = reward.get<double>("timeout_s");
  const int64_t max_output_bytes = reward.get<int64_t>("max_output_bytes");
  HF_CHECK(max_output_bytes > 0, prefix, "max_output_bytes: expected > 0 (bytes), got ", max_output_bytes);
  if (type == "command") {
    const bool has_argv = !reward.is_null("command");
    const bool has_shell = !reward.is_null("shell");
    HF_CHECK(has_argv != has_shell, prefix, "type is 'command': set exactly one of ", prefix, "command (argv list) or ",
             prefix, "shell (command line)");
    if (has_shell)
      return std::make_unique<CommandReward>(
          CommandReward::shell(reward.get<std::string>("shell"), timeout_s, max_output_bytes));
    return std::make_unique<CommandReward>(reward.get<std::vector<std::string>>("command"), timeout_s,
                                           max_output_bytes);
  }
  if (type == "http") {
    HF_CHECK(!reward.is_null("url"), prefix, "type is 'http': set ", prefix,
             "url (http://127.0.0.1:PORT/PATH)");
    return std::make_unique<HttpReward>(reward.get<std::string>("url"), timeout_s,
                                        reward.get<std::vector<std::string>>("allowed_hosts"),
                                        max_output_bytes);
  }
  if (type == "task") {
    HF_CHECK(reward.has("task") && !reward.is_null("task"), prefix, "type is 'task': set ", prefix,
             "task (the built-in task's name, e.g. addition)");
    return std::make_unique<TaskReward>(reward.get<std::string>("task"));
  }
  HF_FAIL(prefix, "type: expected task, command or http, got '", type, "'");
}

}  // namespace hybridflow
