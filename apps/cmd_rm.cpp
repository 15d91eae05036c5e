// `hybridflow rm`: trains a reward (or cost) model on preference pairs with the Bradley-Terry loss,
// from a YAML config plus dotted overrides. Prints a progress line per step and the held-out pairwise
// accuracy at each evaluation; writes the resolved config, generated data, metrics and the final
// value-head model (loadable as reward_model.path / cost_model.path) under trainer.out_dir.
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "fine_tune_config.h"
#include "hybridflow/core/config.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/platform.h"
#include "hybridflow/core/progress.h"
#include "hybridflow/finetune/reward_model_training.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/tasks/dataset.h"
#include "hybridflow/tasks/task.h"
#include "rm_config.h"

namespace hybridflow::cli {
namespace {

// Chosen = the task's answer; rejected = a corrupted copy, several per prompt so the model sees
// more than one wrong answer for each right one.
std::vector<PreferencePair> task_pairs(const Task& task, const std::vector<Example>& examples, int64_t per_prompt,
                                       uint64_t seed) {
  std::vector<PreferencePair> pairs;
  for (int64_t k = 0; k < per_prompt; ++k) {
    auto more = make_preference_pairs(task, examples, seed + static_cast<uint64_t>(k));
    pairs.insert(pairs.end(), more.begin(), more.end());
  }
  return pairs;
}

Pretrained value_model(const Config& cfg, const Task& task) {
  const std::string path = cfg.get<std::string>("model.path");
  if (!path.empty()) return load_pretrained(path, HeadKind::kValue);
  Pretrained out;
  out.tokenizer = Tokenizer::from_alphabet(task.alphabet());
  out.config = preset_model_config(cfg.get<std::string>("model.preset"), out.tokenizer.vocab_size());
  for (auto [key, field] : {std::pair<const char*, int64_t*>{"model.hidden_size", &out.config.hidden_size},
                            {"model.num_hidden_layers", &out.config.num_hidden_layers},
                            {"model.intermediate_size", &out.config.intermediate_size}}) {
    const int64_t v = cfg.get<int64_t>(key);
    if (v > 0) *field = v;
  }
  out.config.bos_token_id = out.tokenizer.bos_id();
  out.config.eos_token_id = out.tokenizer.eos_id();
  out.config.pad_token_id = out.tokenizer.pad_id();
  out.config.validate();
  torch::manual_seed(static_cast<uint64_t>(cfg.get<int64_t>("model.init_seed")));
  out.model = CausalLM(out.config, HeadKind::kValue);
  return out;
}

int run_rm_command(const std::string& config_file, const std::vector<std::string>& overrides) {
  Config cfg = Config::load(kRmDefaultsYaml, config_file, overrides);
  init_threads(cfg.get<int>("trainer.threads"));
  warn_if_slow_blas();

  const std::string out_dir = cfg.get<std::string>("trainer.out_dir");
  make_dirs(out_dir);
  write_file_atomic(out_dir + "/config.yaml", cfg.to_yaml());

  TaskOptions task_options;
  task_options.min_digits = cfg.get<int>("data.min_digits");
  task_options.max_digits = cfg.get<int>("data.max_digits");
  task_options.min_length = cfg.get<int>("data.min_length");
  task_options.max_length = cfg.get<int>("data.max_length");
  auto task = make_task(cfg.get<std::string>("data.task"), task_options);

  RewardModelOptions opts;
  opts.train_file = cfg.get<std::string>("data.train_file");
  opts.eval_file = cfg.get<std::string>("data.test_file");
  if (opts.train_file.empty()) {
    const uint64_t seed = static_cast<uint64_t>(cfg.get<int64_t>("data.seed"));
    DatasetSplits splits =
        make_splits(*task, cfg.get<int64_t>("data.train_size"), cfg.get<int64_t>("data.test_size"), seed);
    const auto train = task_pairs(*task, splits.train, cfg.get<int64_t>("data.pairs_per_prompt"), seed + 1);
    make_dirs(out_dir + "/data");
    opts.train_file = out_dir + "/data/train_pairs.jsonl";
    write_preference_jsonl(opts.train_file, train);
    if (opts.eval_file.empty()) {
      opts.eval_file = out_dir + "/data/test_pairs.jsonl";
      // Seeds after the training ones: a held-out prompt's corruption is drawn independently.
      write_preference_jsonl(opts.eval_file, make_preference_pairs(*task, splits.test, seed + 1000003));
    }
    std::printf("data: %zu train / %zu held-out %s preference pairs in %s/data\n", train.size(), splits.test.size(),
                task->name().c_str(), out_dir.c_str());
  }
  read_fine_tune_options(cfg, opts);
  opts.out_dir = out_dir;
  opts.add_bos = cfg.get<bool>("data.add_bos");

  Pretrained pre = value_model(cfg, *task);
  pre.model->to(torch::Device(resolve_device_name(cfg.get<std::string>("trainer.device"), "trainer.device")));
  ProgressLine progress("rm", opts.steps > 0 ? opts.steps : 0, 25);
  RewardModelResult result = train_reward_model(opts, pre.model, pre.tokenizer, [&](const RewardModelMetrics& m) {
    std::vector<std::pair<std::string, double>> figures = {
        {"loss", m.loss}, {"acc", m.accuracy}, {"margin", m.margin}, {"lr", m.lr}};
    if (m.eval_accuracy >= 0) {
      figures.push_back({"heldout_acc", m.eval_accuracy});
      std::printf("eval step %lld: held-out pairwise accuracy %.3f\n", static_cast<long long>(m.step), m.eval_accuracy);
    }
    progress.update(m.step, m.tokens, figures);
  });
  progress.finish({{"final_heldout_acc", result.final_eval_accuracy}});

  const std::string final_dir = out_dir + "/final";
  save_pretrained(final_dir, pre.model, pre.tokenizer);
  std::printf("rm summary: %lld steps, held-out pairwise accuracy %.3f -> %.3f, value-head model in %s\n",
              static_cast<long long>(result.steps), result.initial_eval_accuracy, result.final_eval_accuracy,
              final_dir.c_str());
  return 0;
}

}  // namespace

void add_rm_command(CLI::App& app, Action& action) {
  auto config_file = std::make_shared<std::string>();
  auto overrides = std::make_shared<std::vector<std::string>>();
  CLI::App* cmd = app.add_subcommand("rm", "Train a reward (or cost) model on preference pairs (Bradley-Terry)");
  cmd->add_option("-c,--config", *config_file, "YAML config (keys: docs/configuration.md)");
  cmd->add_option("overrides", *overrides, "dotted overrides, e.g. optim.lr=1e-3 trainer.steps=100");
  cmd->footer("Keys and defaults: docs/configuration.md (section rm).");
  cmd->callback([config_file, overrides, &action] {
    action = [config_file, overrides] { return run_rm_command(*config_file, *overrides); };
  });
}

}  // namespace hybridflow::cli
