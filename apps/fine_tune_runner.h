// The one runner behind `hybridflow sft`, `hybridflow rm` and `hybridflow dpo`. Each command loads a YAML
// config with dotted overrides, records it under trainer.out_dir, makes the task, generates data from it when
// data.train_file is empty, reads the keys they share (optim.*, the trainer's step budget, batch sizes,
// evaluation cadence and seed) the same way, moves the model to trainer.device, prints a progress line with the
// held-out evaluations, saves the final model to out_dir/final and prints a summary. A command supplies only
// what differs: its schema, its data, its own keys, its model and its loop (a FineTuneLoop).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "hybridflow/core/config.h"
#include "hybridflow/core/progress.h"
#include "hybridflow/finetune/fine_tune_options.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/tasks/task.h"

namespace hybridflow::cli {

// The progress line of a fine-tuning loop and its held-out evaluations.
class FineTuneProgress {
 public:
  // eval_metric names the held-out score in the evaluation lines ("exact match", "pairwise accuracy").
  FineTuneProgress(const std::string& label, int64_t total_steps, std::string eval_metric);

  // One optimizer step done. eval_accuracy >= 0: the step ended with an evaluation, printed on a line of
  // its own and shown as heldout_acc among the figures.
  void step(int64_t step, int64_t tokens, std::vector<std::pair<std::string, double>> figures, double eval_accuracy);
  void finish(double final_eval_accuracy);

  double first_eval_accuracy() const { return first_eval_accuracy_; }  // -1 before any evaluation
  double last_eval_accuracy() const { return last_eval_accuracy_; }

 private:
  ProgressLine line_;
  std::string eval_metric_;
  double first_eval_accuracy_ = -1;
  double last_eval_accuracy_ = -1;
};

// What a loop reports for the summary line.
struct FineTuneOutcome {
  int64_t steps = 0;
  double first_eval_accuracy = -1;  // the summary's "from"
  double last_eval_accuracy = -1;   // the summary's "to"
  double final_eval_accuracy = -1;  // the progress line's final_heldout_acc
  FineTuneRunInfo run;              // resumed from, stopped early, the last checkpoint
};

// What one fine-tuning command does between the runner's shared steps, called in this order.
class FineTuneLoop {
 public:
  virtual ~FineTuneLoop() = default;
  // Task options beyond data.min_digits / data.max_digits, which every command reads.
  virtual void read_task_options(const Config& cfg, TaskOptions& options) const;
  // data.train_file is empty: writes rows generated from the task under data_dir (which exists), points
  // options.train_file at them (and options.eval_file, when data.test_file is empty too) and says so.
  virtual void write_task_data(const Config& cfg, const Task& task, const std::string& data_dir,
                               FineTuneOptions& options) = 0;
  // The command's own keys, read after the shared ones (`shared`, with out_dir set).
  virtual void read_options(const Config& cfg, const Task& task, const FineTuneOptions& shared) = 0;
  virtual Pretrained load_model(const Config& cfg, const Task& task) = 0;
  // Trains the model (already on trainer.device) in place, reporting each step to `progress`.
  virtual FineTuneOutcome train(Pretrained& model, FineTuneProgress& progress) = 0;
};

struct FineTuneCommand {
  std::string name;              // the subcommand; also labels the progress line and the summary
  std::string description;       // --help
  std::string override_example;  // --help: "dotted overrides, e.g. ..."
  std::string defaults_yaml;     // the command's schema with its defaults
  std::string eval_metric;       // see FineTuneProgress
  std::string final_model;       // what out_dir/final holds, in the summary ("final model")
  std::function<std::unique_ptr<FineTuneLoop>()> make_loop;
};

// The keys both commands read the same way, into the options both loops share.
void read_fine_tune_options(const Config& cfg, FineTuneOptions& options);

// Registers the subcommand (-c/--config and dotted overrides) and runs it through the shared steps.
void add_fine_tune_command(CLI::App& app, Action& action, FineTuneCommand command);

}  // namespace hybridflow::cli
