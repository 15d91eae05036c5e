// `hybridflow dpo`: direct preference optimisation of a language model on preference pairs against a frozen
// reference (finetune/dpo.h), through the fine-tuning runner (fine_tune_runner.h). Prints a progress line per
// step with the implicit rewards and, at each evaluation, the held-out greedy score against the chosen answers;
// writes the resolved config, generated pairs, metrics and the final model under trainer.out_dir.
#include <memory>
#include <string>

#include "commands.h"
#include "dpo_config.h"
#include "fine_tune_runner.h"
#include "preference_data.h"
#include "hybridflow/finetune/dpo.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/tasks/task.h"

namespace hybridflow::cli {
namespace {

class DpoLoop final : public PreferencePairLoop {
 public:
  void read_options(const Config& cfg, const Task& task, const FineTuneOptions& shared) override {
    static_cast<FineTuneOptions&>(options_) = shared;
    options_.model_dir = cfg.get<std::string>("model.path");
    options_.apply_chat_template = cfg.get<bool>("data.apply_chat_template");
    options_.add_bos = cfg.get<bool>("data.add_bos");
    options_.beta = cfg.get<double>("dpo.beta");
    options_.loss_type = parse_dpo_loss_type(cfg.get<std::string>("dpo.loss_type"));
    options_.label_smoothing = cfg.get<double>("dpo.label_smoothing");
    options_.simpo_gamma = cfg.get<double>("dpo.simpo_gamma");
    check_dpo_options(options_);
    options_.max_new_tokens = cfg.get<int64_t>("trainer.max_new_tokens");
    const Task* task_ptr = &task;
    options_.scorer = [task_ptr](const std::string& response, const std::string& chosen) {
      return task_ptr->score(response, Example{"", chosen});
    };
  }

  // The policy from model.path; the reference from model.ref_path, frozen. Without model.ref_path the
  // reference is the starting model: with LoRA the policy with its adapters off (no second copy of the
  // weights), else model.path loaded again. simpo and orpo load none.
  Pretrained load_model(const Config& cfg, const Task&) override {
    const std::string path = cfg.get<std::string>("model.path");
    const std::string ref_path = cfg.get<std::string>("model.ref_path");
    if (dpo_loss_is_reference_free(options_.loss_type)) return load_pretrained(path);
    if (!ref_path.empty() || cfg.get<int64_t>("model.lora_rank") <= 0)
      reference_ = load_pretrained(ref_path.empty() ? path : ref_path).model;
    return load_pretrained(path);
  }

  FineTuneOutcome train(Pretrained& pre, FineTuneProgress& progress) override {
    if (reference_) reference_->to(pre.model->parameters().front().device());
    DpoResult result = train_dpo(options_, pre.model, reference_, pre.tokenizer, [&](const DpoMetrics& m) {
      progress.step(m.step, m.tokens,
                    {{"loss", m.loss}, {"rewards/acc", m.reward_accuracy}, {"rewards/margin", m.reward_margin},
                     {"lr", m.lr}},
                    m.eval_accuracy);
    });
    // The summary spans the evaluation before the first update to the last.
    return {result.steps, result.initial_eval_accuracy, result.final_eval_accuracy, result.final_eval_accuracy, result};
  }

 private:
  DpoOptions options_;
  CausalLM reference_{nullptr};
};

}  // namespace

void add_dpo_command(CLI::App& app, Action& action) {
  add_fine_tune_command(app, action,
                        {"dpo", "Direct preference optimisation on preference pairs against a frozen reference",
                         "dpo.beta=0.1 trainer.steps=100", kDpoDefaultsYaml, "exact match", "final model",
                         [] { return std::make_unique<DpoLoop>(); }});
}

}  // namespace hybridflow::cli
