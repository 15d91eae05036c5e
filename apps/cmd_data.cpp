// `hybridflow data --task NAME --out DIR [--format jsonl | parquet | verl-jsonl]`: a built-in task's
// train / test split written as data files, the files `data.train_file` / `data.test_file` read.
// jsonl: hybridflow's rows {"prompt", "answer", "response"} (what `hybridflow sft` writes). parquet: verl's
// format with the question as a chat message (docs/data.md), for chat models and verl itself; verl-jsonl:
// the same rows as JSON lines, to read or edit by hand.
#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/tasks/dataset.h"
#include "hybridflow/tasks/parquet_rows.h"
#include "hybridflow/tasks/prompt_rows.h"

namespace hybridflow::cli {
namespace {

struct DataOptions {
  std::string task = "addition";
  std::string out;
  std::string format = "jsonl";
  int64_t train_size = 1000;
  int64_t test_size = 100;
  uint64_t seed = 0;
  int min_digits = 1;
  int max_digits = 3;
  int min_length = 3;
  int max_length = 6;
};

std::vector<nlohmann::ordered_json> verl_rows(const Task& task, const std::vector<Example>& examples,
                                              const std::string& split) {
  std::vector<nlohmann::ordered_json> rows;
  rows.reserve(examples.size());
  for (size_t i = 0; i < examples.size(); ++i) rows.push_back(verl_row(task, examples[i], split, static_cast<int64_t>(i)));
  return rows;
}

void write_split(const DataOptions& o, const Task& task, const std::vector<Example>& examples, const std::string& split,
                 const std::string& path) {
  if (o.format == "jsonl") return write_examples_jsonl(path, examples);
  const auto rows = verl_rows(task, examples, split);
  if (o.format == "parquet") return write_parquet_rows(path, rows);
  std::string text;  // written here, not by write_jsonl, to keep verl's column order in each line
  for (const auto& row : rows) text += row.dump() + "\n";
  write_file_atomic(path, text);
}

int run_data(const DataOptions& o) {
  HF_CHECK(o.format == "jsonl" || o.format == "parquet" || o.format == "verl-jsonl",
           "data: --format must be jsonl, parquet or verl-jsonl, got '", o.format, "'");
  TaskOptions task_options;
  task_options.min_digits = o.min_digits;
  task_options.max_digits = o.max_digits;
  task_options.min_length = o.min_length;
  task_options.max_length = o.max_length;
  const auto task = make_task(o.task, task_options);
  const DatasetSplits splits = make_splits(*task, o.train_size, o.test_size, o.seed);
  make_dirs(o.out);
  const std::string ext = o.format == "parquet" ? ".parquet" : ".jsonl";
  write_split(o, *task, splits.train, "train", o.out + "/train" + ext);
  write_split(o, *task, splits.test, "test", o.out + "/test" + ext);
  std::printf("wrote %s/train%s (%zu rows) and %s/test%s (%zu rows): task %s, %s\n", o.out.c_str(), ext.c_str(),
              splits.train.size(), o.out.c_str(), ext.c_str(), splits.test.size(), task->name().c_str(), o.format.c_str());
  return 0;
}

}  // namespace

void add_data_command(CLI::App& app, Action& action) {
  auto opts = std::make_shared<DataOptions>();
  CLI::App* cmd = app.add_subcommand("data", "Write a built-in task's train/test split as data files (JSONL or verl parquet)");
  cmd->add_option("--task", opts->task, "built-in task: addition | addition_reversed | reverse | sort")->capture_default_str();
  cmd->add_option("--out", opts->out, "output directory (train.<ext> and test.<ext>)")->required();
  cmd->add_option("--format", opts->format,
                  "jsonl: {prompt, answer, response} rows; parquet: verl's format with chat messages; verl-jsonl: the "
                  "same rows as JSON lines")
      ->capture_default_str();
  cmd->add_option("--train-size", opts->train_size, "training examples")->capture_default_str();
  cmd->add_option("--test-size", opts->test_size, "held-out examples (no prompt in both)")->capture_default_str();
  cmd->add_option("--seed", opts->seed, "sampling seed")->capture_default_str();
  cmd->add_option("--min-digits", opts->min_digits, "addition: fewest operand digits")->capture_default_str();
  cmd->add_option("--max-digits", opts->max_digits, "addition: most operand digits")->capture_default_str();
  cmd->add_option("--min-length", opts->min_length, "reverse / sort: shortest string")->capture_default_str();
  cmd->add_option("--max-length", opts->max_length, "reverse / sort: longest string")->capture_default_str();
  cmd->callback([opts, &action] { action = [opts] { return run_data(*opts); }; });
}

}  // namespace hybridflow::cli
