#include "hybridflow/workers/task_reward.h"

#include "hybridflow/core/error.h"

namespace hybridflow {

TaskReward::TaskReward(std::shared_ptr<const Task> task) : task_(std::move(task)) {
  HF_CHECK(task_ != nullptr, "TaskReward: no task given");
}

TaskReward::TaskReward(const std::string& task_name) : TaskReward(std::shared_ptr<const Task>(make_task(task_name))) {}

std::string TaskReward::describe() const { return "task '" + task_->name() + "'"; }

std::vector<double> TaskReward::score(const std::vector<RewardRequest>& batch) {
  std::vector<double> scores;
  scores.reserve(batch.size());
  for (const auto& request : batch) scores.push_back(task_->score(request.response, Example{request.prompt, request.answer}));
  return scores;
}

}  // namespace hybridflow
