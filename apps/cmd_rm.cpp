// `hybridflow rm`: trains a reward (or cost) model on preference pairs with the Bradley-Terry loss, from a
// YAML config plus dotted overrides, through the fine-tuning runner (fine_tune_runner.h). Prints a progress
// line per step and the held-out pairwise accuracy at each evaluation; writes the resolved config, generated
// data, metrics and the final value-head model (loadable as reward_model.path / cost_model.path) under
// trainer.out_dir.
#include <memory>
#include <string>
#include <utility>

#include "commands.h"
#include "fine_tune_runner.h"
#include "preference_data.h"
#include "hybridflow/finetune/reward_model_training.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/tasks/task.h"
#include "rm_config.h"

namespace hybridflow::cli {
namespace {

class RewardModelLoop final : public PreferencePairLoop {
 public:
  void read_options(const Config& cfg, const Task&, const FineTuneOptions& shared) override {
    static_cast<FineTuneOptions&>(options_) = shared;
    options_.model_dir = cfg.get<std::string>("model.path");
    options_.apply_chat_template = cfg.get<bool>("data.apply_chat_template");
    options_.add_bos = cfg.get<bool>("data.add_bos");
  }

  // model.path, or a fresh preset with the task's alphabet.
  Pretrained load_model(const Config& cfg, const Task& task) override {
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

  FineTuneOutcome train(Pretrained& pre, FineTuneProgress& progress) override {
    RewardModelResult result = train_reward_model(options_, pre.model, pre.tokenizer, [&](const RewardModelMetrics& m) {
      progress.step(m.step, m.tokens, {{"loss", m.loss}, {"acc", m.accuracy}, {"margin", m.margin}, {"lr", m.lr}},
                    m.eval_accuracy);
    });
    // The summary spans the evaluation before the first update to the last.
    return {result.steps, result.initial_eval_accuracy, result.final_eval_accuracy, result.final_eval_accuracy, result};
  }

 private:
  RewardModelOptions options_;
};

}  // namespace

void add_rm_command(CLI::App& app, Action& action) {
  add_fine_tune_command(app, action,
                        {"rm", "Train a reward (or cost) model on preference pairs (Bradley-Terry)",
                         "optim.lr=1e-3 trainer.steps=100", kRmDefaultsYaml, "pairwise accuracy", "value-head model",
                         [] { return std::make_unique<RewardModelLoop>(); }});
}

}  // namespace hybridflow::cli
