#include "fine_tune_runner.h"

#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/platform.h"
#include "hybridflow/finetune/fine_tune_checkpoint.h"
#include "hybridflow/model/lora.h"
#include "hybridflow/model/lora_setup.h"
#include "hybridflow/trainer/lora_keys.h"
#include "hybridflow/transport/process_pool.h"

namespace hybridflow::cli {

FineTuneProgress::FineTuneProgress(const std::string& label, int64_t total_steps, std::string eval_metric)
    : line_(label, total_steps, 25), eval_metric_(std::move(eval_metric)) {}

void FineTuneProgress::step(int64_t step, int64_t tokens, std::vector<std::pair<std::string, double>> figures,
                            double eval_accuracy) {
  if (eval_accuracy >= 0) {
    figures.push_back({"heldout_acc", eval_accuracy});
    if (first_eval_accuracy_ < 0) first_eval_accuracy_ = eval_accuracy;
    last_eval_accuracy_ = eval_accuracy;
    std::printf("eval step %lld: held-out %s %.3f\n", static_cast<long long>(step), eval_metric_.c_str(),
                eval_accuracy);
  }
  line_.update(step, tokens, figures);
}

void FineTuneProgress::finish(double final_eval_accuracy) {
  line_.finish({{"final_heldout_acc", final_eval_accuracy}});
}

void FineTuneLoop::read_task_options(const Config&, TaskOptions&) const {}

void read_fine_tune_options(const Config& cfg, FineTuneOptions& options) {
  options.lr = cfg.get<double>("optim.lr");
  options.weight_decay = cfg.get<double>("optim.weight_decay");
  OptimizerOptions adam;
  set_adam_betas(adam, cfg.get<std::vector<double>>("optim.betas"), "optim.betas");
  options.beta1 = adam.beta1;
  options.beta2 = adam.beta2;
  options.eps = cfg.get<double>("optim.eps");
  HF_CHECK(options.eps > 0, "optim.eps must be > 0, got ", options.eps);
  options.warmup_steps = cfg.get<int64_t>("optim.warmup_steps");
  options.schedule = cfg.get<std::string>("optim.schedule");
  options.min_lr_ratio = cfg.get<double>("optim.min_lr_ratio");
  options.grad_clip = cfg.get<double>("optim.grad_clip");
  options.steps = cfg.get<int64_t>("trainer.steps");
  options.epochs = cfg.get<int64_t>("trainer.epochs");
  options.batch_size = cfg.get<int64_t>("trainer.batch_size");
  options.micro_batch_size = cfg.get<int64_t>("trainer.micro_batch_size");
  options.eval_every = cfg.get<int64_t>("trainer.eval_every");
  options.eval_samples = cfg.get<int64_t>("trainer.eval_samples");
  options.seed = static_cast<uint64_t>(cfg.get<int64_t>("trainer.seed"));
  options.save_every = cfg.get<int64_t>("trainer.save_every");
  HF_CHECK(options.save_every >= 0, "trainer.save_every must be >= 0 steps, got ", options.save_every);
  options.max_ckpt_to_keep = cfg.get<int64_t>("trainer.max_ckpt_to_keep");
  HF_CHECK(options.max_ckpt_to_keep >= 0, "trainer.max_ckpt_to_keep must be >= 0 (0 = keep all), got ",
           options.max_ckpt_to_keep);
  options.resume_mode = cfg.get<std::string>("trainer.resume_mode");
  options.resume_from_path = cfg.get<std::string>("trainer.resume_from_path");
  // The first Ctrl-C (or SIGTERM) ends the loop after its step, with a checkpoint; a second one kills.
  options.stop_requested = [] { return stop_requested_signal() != 0; };
}

namespace {

int run_fine_tune_command(const FineTuneCommand& command, const std::string& config_file,
                          const std::vector<std::string>& overrides) {
  Config cfg = Config::load(command.defaults_yaml, config_file, overrides);
  enable_graceful_stop_on_signals();
  init_threads(cfg.get<int>("trainer.threads"));
  warn_if_slow_blas();

  const std::string out_dir = cfg.get<std::string>("trainer.out_dir");
  make_dirs(out_dir);
  write_file_atomic(out_dir + "/config.yaml", cfg.to_yaml());

  const std::unique_ptr<FineTuneLoop> loop = command.make_loop();
  TaskOptions task_options;
  task_options.min_digits = cfg.get<int>("data.min_digits");
  task_options.max_digits = cfg.get<int>("data.max_digits");
  loop->read_task_options(cfg, task_options);
  // Owned here: a loop's scorer may point at the task until training ends.
  const std::unique_ptr<Task> task = make_task(cfg.get<std::string>("data.task"), task_options);

  FineTuneOptions shared;
  read_fine_tune_options(cfg, shared);  // a bad optimizer value fails before any data is generated
  shared.train_file = cfg.get<std::string>("data.train_file");
  shared.eval_file = cfg.get<std::string>("data.test_file");
  if (shared.train_file.empty()) {
    const std::string data_dir = out_dir + "/data";
    make_dirs(data_dir);
    loop->write_task_data(cfg, *task, data_dir, shared);
  }
  shared.out_dir = out_dir;
  loop->read_options(cfg, *task, shared);

  Pretrained pre = loop->load_model(cfg, *task);
  pre.model->to(torch::Device(resolve_device_name(cfg.get<std::string>("trainer.device"), "trainer.device")));
  // LoRA (model.lora_rank, ...; docs/lora.md): only the adapters (and a reward model's value head) train.
  std::string adapter_path;
  const LoraConfig lora = read_lora_keys(cfg.subtree("model"), &adapter_path);
  add_configured_lora(pre.model, lora, adapter_path, shared.seed, "model");
  FineTuneProgress progress(command.name, shared.steps > 0 ? shared.steps : 0, command.eval_metric);
  const FineTuneOutcome outcome = loop->train(pre, progress);
  progress.finish(outcome.final_eval_accuracy);
  if (outcome.run.stopped) {
    const int sig = stop_requested_signal();
    std::fprintf(stderr, "%s: stopped by %s; checkpoint: %s\nresume with the same command (trainer.resume_mode: auto "
                 "continues from the newest checkpoint of %s)\n",
                 command.name.c_str(), sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal",
                 outcome.run.last_checkpoint.empty() ? "none (trainer.out_dir is not set)" : outcome.run.last_checkpoint.c_str(),
                 out_dir.c_str());
    return 128 + (sig > 0 ? sig : SIGINT);
  }

  const std::string final_dir = out_dir + "/final";
  // The checkpoint written after the last step holds these weights: final/ links its files.
  const std::string last = checkpoint_dir(out_dir, outcome.steps);
  save_final_model(final_dir, outcome.run.last_checkpoint == last ? last : std::string(), pre.model,
                   pre.tokenizer);  // with LoRA: the base model, the adapters beside it
  if (pre.model->has_lora()) {
    const std::string base = cfg.has("model.path") ? cfg.get<std::string>("model.path") : "";
    save_lora_adapter(final_dir + "/lora_adapter", pre.model, base.empty() ? final_dir : base);
    std::printf("%s: LoRA adapters in %s/lora_adapter (PEFT's format)\n", command.name.c_str(), final_dir.c_str());
  }
  const std::string resumed =
      outcome.run.resumed_step > 0 ? " (resumed at step " + std::to_string(outcome.run.resumed_step) + ")" : "";
  std::printf("%s summary: %lld steps%s, held-out %s %.3f -> %.3f, %s in %s\n", command.name.c_str(),
              static_cast<long long>(outcome.steps), resumed.c_str(), command.eval_metric.c_str(),
              outcome.first_eval_accuracy, outcome.last_eval_accuracy, command.final_model.c_str(), final_dir.c_str());
  return 0;
}

}  // namespace

void add_fine_tune_command(CLI::App& app, Action& action, FineTuneCommand command) {
  auto shared_command = std::make_shared<const FineTuneCommand>(std::move(command));
  auto config_file = std::make_shared<std::string>();
  auto overrides = std::make_shared<std::vector<std::string>>();
  CLI::App* cmd = app.add_subcommand(shared_command->name, shared_command->description);
  cmd->add_option("-c,--config", *config_file, "YAML config (keys: docs/configuration.md)");
  cmd->add_option("overrides", *overrides, "dotted overrides, e.g. " + shared_command->override_example);
  cmd->footer("Keys and defaults: docs/configuration.md (section " + shared_command->name + ").");
  cmd->callback([shared_command, config_file, overrides, &action] {
    action = [shared_command, config_file, overrides] {
      return run_fine_tune_command(*shared_command, *config_file, *overrides);
    };
  });
}

}  // namespace hybridflow::cli
