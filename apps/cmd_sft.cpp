// `hybridflow sft`: supervised fine-tuning from a YAML config plus dotted overrides. Prints a
// progress line per step and held-out exact-match accuracy at each evaluation; writes checkpoints,
// metrics and the resolved config under trainer.out_dir, and the final model to out_dir/final.
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "fine_tune_config.h"
#include "hybridflow/core/config.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/platform.h"
#include "hybridflow/core/progress.h"
#include "hybridflow/finetune/sft.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/tasks/dataset.h"
#include "hybridflow/tasks/task.h"
#include "sft_config.h"

namespace hybridflow::cli {
namespace {

int run_sft_command(const std::string& config_file, const std::vector<std::string>& overrides) {
  Config cfg = Config::load(kSftDefaultsYaml, config_file, overrides);
  init_threads(cfg.get<int>("trainer.threads"));
  warn_if_slow_blas();

  const std::string out_dir = cfg.get<std::string>("trainer.out_dir");
  make_dirs(out_dir);
  write_file_atomic(out_dir + "/config.yaml", cfg.to_yaml());

  TaskOptions task_options;
  task_options.min_digits = cfg.get<int>("data.min_digits");
  task_options.max_digits = cfg.get<int>("data.max_digits");
  auto task = make_task(cfg.get<std::string>("data.task"), task_options);

  SftOptions opts;
  opts.train_file = cfg.get<std::string>("data.train_file");
  opts.eval_file = cfg.get<std::string>("data.test_file");
  if (opts.train_file.empty()) {
    DatasetSplits splits = make_splits(*task, cfg.get<int64_t>("data.train_size"), cfg.get<int64_t>("data.test_size"),
                                       static_cast<uint64_t>(cfg.get<int64_t>("data.seed")));
    make_dirs(out_dir + "/data");
    opts.train_file = out_dir + "/data/train.jsonl";
    write_examples_jsonl(opts.train_file, splits.train);
    if (opts.eval_file.empty()) {
      opts.eval_file = out_dir + "/data/test.jsonl";
      write_examples_jsonl(opts.eval_file, splits.test);
    }
    std::printf("data: %zu train / %zu held-out %s examples in %s/data\n", splits.train.size(), splits.test.size(),
                task->name().c_str(), out_dir.c_str());
  }
  read_fine_tune_options(cfg, opts);
  opts.save_every = cfg.get<int64_t>("trainer.save_every");
  opts.out_dir = out_dir;
  opts.max_new_tokens = cfg.get<int64_t>("trainer.max_new_tokens");
  opts.model_dir = cfg.get<std::string>("model.path");
  opts.apply_chat_template = cfg.get<bool>("data.apply_chat_template");
  const Task* task_ptr = task.get();
  opts.scorer = [task_ptr](const std::string& response, const std::string& answer) {
    return task_ptr->score(response, Example{"", answer});
  };

  Pretrained pre = load_pretrained(cfg.get<std::string>("model.path"));
  pre.model->to(torch::Device(resolve_device_name(cfg.get<std::string>("trainer.device"), "trainer.device")));
  ProgressLine progress("sft", opts.steps > 0 ? opts.steps : 0, 25);
  double first_accuracy = -1, last_accuracy = -1;
  SftResult result = run_sft(opts, pre.model, pre.tokenizer, [&](const SftMetrics& m) {
    std::vector<std::pair<std::string, double>> figures = {{"loss", m.loss}, {"lr", m.lr}, {"grad_norm", m.grad_norm}};
    if (m.eval_accuracy >= 0) {
      figures.push_back({"heldout_acc", m.eval_accuracy});
      if (first_accuracy < 0) first_accuracy = m.eval_accuracy;
      last_accuracy = m.eval_accuracy;
      std::printf("eval step %lld: held-out exact match %.3f\n", static_cast<long long>(m.step), m.eval_accuracy);
    }
    progress.update(m.step, m.tokens, figures);
  });
  progress.finish({{"final_heldout_acc", result.final_eval_accuracy}});

  const std::string final_dir = out_dir + "/final";
  save_pretrained(final_dir, pre.model, pre.tokenizer);
  std::printf("sft summary: %lld steps, held-out exact match %.3f -> %.3f, final model in %s\n",
              static_cast<long long>(result.steps), first_accuracy, last_accuracy, final_dir.c_str());
  return 0;
}

}  // namespace

void add_sft_command(CLI::App& app, Action& action) {
  auto config_file = std::make_shared<std::string>();
  auto overrides = std::make_shared<std::vector<std::string>>();
  CLI::App* cmd = app.add_subcommand("sft", "Supervised fine-tuning on prompt/response JSONL (or a built-in task)");
  cmd->add_option("-c,--config", *config_file, "YAML config (keys: docs/configuration.md)");
  cmd->add_option("overrides", *overrides, "dotted overrides, e.g. optim.lr=1e-4 trainer.steps=100");
  cmd->footer("Keys and defaults: docs/configuration.md (section sft).");
  cmd->callback([config_file, overrides, &action] {
    action = [config_file, overrides] { return run_sft_command(*config_file, *overrides); };
  });
}

}  // namespace hybridflow::cli
