#include "preference_data.h"

#include <cstdio>

#include "hybridflow/tasks/dataset.h"

namespace hybridflow::cli {

void PreferencePairLoop::read_task_options(const Config& cfg, TaskOptions& options) const {
  options.min_length = cfg.get<int>("data.min_length");
  options.max_length = cfg.get<int>("data.max_length");
}

void PreferencePairLoop::write_task_data(const Config& cfg, const Task& task, const std::string& data_dir,
                                         FineTuneOptions& options) {
  const uint64_t seed = static_cast<uint64_t>(cfg.get<int64_t>("data.seed"));
  DatasetSplits splits =
      make_splits(task, cfg.get<int64_t>("data.train_size"), cfg.get<int64_t>("data.test_size"), seed);
  // Several corruptions per training prompt: more than one wrong answer for each right one.
  const auto train = make_preference_pairs(task, splits.train, cfg.get<int64_t>("data.pairs_per_prompt"), seed + 1);
  options.train_file = data_dir + "/train_pairs.jsonl";
  write_preference_jsonl(options.train_file, train);
  if (options.eval_file.empty()) {
    options.eval_file = data_dir + "/test_pairs.jsonl";
    // Seeds after the training ones: a held-out prompt's corruption is drawn independently.
    write_preference_jsonl(options.eval_file, make_preference_pairs(task, splits.test, seed + 1000003));
  }
  std::printf("data: %zu train / %zu held-out %s preference pairs in %s\n", train.size(), splits.test.size(),
              task.name().c_str(), data_dir.c_str());
}

}  // namespace hybridflow::cli
