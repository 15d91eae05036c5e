// Scores a batch with a built-in task's rule (tasks/task.h): the request's `answer` is the reference.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hybridflow/tasks/task.h"
#include "hybridflow/workers/reward_function.h"

namespace hybridflow {

class TaskReward : public RewardFunction {
 public:
  explicit TaskReward(std::shared_ptr<const Task> task);
  // make_task(name); an unknown name -> Error listing the valid ones.
  explicit TaskReward(const std::string& task_name);

  std::vector<double> score(const std::vector<RewardRequest>& batch) override;
  std::string describe() const override;

 private:
  std::shared_ptr<const Task> task_;
};

}  // namespace hybridflow
