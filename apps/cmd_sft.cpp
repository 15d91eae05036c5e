// `hybridflow sft`: supervised fine-tuning from a YAML config plus dotted overrides, through the fine-tuning
// runner (fine_tune_runner.h). Prints a progress line per step and held-out exact-match accuracy at each
// evaluation; writes checkpoints, metrics and the resolved config under trainer.out_dir, and the final model
// to out_dir/final.
#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "fine_tune_runner.h"
#include "hybridflow/finetune/sft.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/tasks/dataset.h"
#include "hybridflow/tasks/task.h"
#include "sft_config.h"

namespace hybridflow::cli {
namespace {

class SftLoop final : public FineTuneLoop {
 public:
  void write_task_data(const Config& cfg, const Task& task, const std::string& data_dir,
                       FineTuneOptions& options) override {
    DatasetSplits splits = make_splits(task, cfg.get<int64_t>("data.train_size"), cfg.get<int64_t>("data.test_size"),
                                       static_cast<uint64_t>(cfg.get<int64_t>("data.seed")));
    options.train_file = data_dir + "/train.jsonl";
    write_examples_jsonl(options.train_file, splits.train);
    if (options.eval_file.empty()) {
      options.eval_file = data_dir + "/test.jsonl";
      write_examples_jsonl(options.eval_file, splits.test);
    }
    std::printf("data: %zu train / %zu held-out %s examples in %s\n", splits.train.size(), splits.test.size(),
                task.name().c_str(), data_dir.c_str());
  }

  void read_options(const Config& cfg, const Task& task, const FineTuneOptions& shared) override {
    static_cast<FineTuneOptions&>(options_) = shared;
    options_.max_new_tokens = cfg.get<int64_t>("trainer.max_new_tokens");
    options_.model_dir = cfg.get<std::string>("model.path");
    options_.apply_chat_template = cfg.get<bool>("data.apply_chat_template");
    const Task* task_ptr = &task;
    options_.scorer = [task_ptr](const std::string& response, const std::string& answer) {
      return task_ptr->score(response, Example{"", answer});
    };
  }

  Pretrained load_model(const Config& cfg, const Task&) override {
    return load_pretrained(cfg.get<std::string>("model.path"));
  }

  FineTuneOutcome train(Pretrained& pre, FineTuneProgress& progress) override {
    SftResult result = run_sft(options_, pre.model, pre.tokenizer, [&](const SftMetrics& m) {
      progress.step(m.step, m.tokens, {{"loss", m.loss}, {"lr", m.lr}, {"grad_norm", m.grad_norm}}, m.eval_accuracy);
    });
    // The summary spans the evaluations the run printed.
    return {result.steps, progress.first_eval_accuracy(), progress.last_eval_accuracy(), result.final_eval_accuracy,
            result};
  }

 private:
  SftOptions options_;
};

}  // namespace

void add_sft_command(CLI::App& app, Action& action) {
  add_fine_tune_command(app, action,
                        {"sft", "Supervised fine-tuning on prompt/response JSONL (or a built-in task)",
                         "optim.lr=1e-4 trainer.steps=100", kSftDefaultsYaml, "exact match", "final model",
                         [] { return std::make_unique<SftLoop>(); }});
}

}  // namespace hybridflow::cli
