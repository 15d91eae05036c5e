// What `hybridflow rm` and `hybridflow dpo` share beside the fine-tuning runner: the string tasks' length
// options and preference pairs generated from a task (chosen = the answer, rejected = a corrupted copy).
#pragma once

#include <string>

#include "fine_tune_runner.h"
#include "hybridflow/core/config.h"
#include "hybridflow/finetune/fine_tune_options.h"
#include "hybridflow/tasks/task.h"

namespace hybridflow::cli {

// A fine-tuning loop on preference pairs: the string tasks' data.min_length / data.max_length, and when
// data.train_file is empty, data.train_size prompts with data.pairs_per_prompt pairs each written to
// data_dir/train_pairs.jsonl and (without a test file) one pair per held-out prompt to test_pairs.jsonl.
class PreferencePairLoop : public FineTuneLoop {
 public:
  void read_task_options(const Config& cfg, TaskOptions& options) const override;
  void write_task_data(const Config& cfg, const Task& task, const std::string& data_dir,
                       FineTuneOptions& options) override;
};

}  // namespace hybridflow::cli
