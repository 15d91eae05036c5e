// Direct preference optimisation (Rafailov et al. 2023) on preference pairs: the policy learns from
// {"prompt", "chosen", "rejected"} rows (the reward model's format) against a frozen reference, with no reward
// model and no generation in the loop. With pi and ref the sequence log-probabilities of a response given its
// prompt (response tokens and eos, summed), the implicit reward of a response is beta (log pi - log ref) and
//   sigmoid (DPO):  -(1 - eps) log sigmoid(beta m) - eps log sigmoid(-beta m)   (eps: label_smoothing, cDPO)
//   ipo (IPO):      (m - 1 / (2 beta))^2
// where m = (log pi(chosen) - log ref(chosen)) - (log pi(rejected) - log ref(rejected)), as TRL's DPOTrainer
// and OpenRLHF compute them. Two losses need no reference model (none is loaded or run), with a = a response's
// mean log-prob per token (eos included):
//   simpo (SimPO, Meng et al. 2024): -(1 - eps) log sigmoid(beta (a_w - a_l) - gamma) - eps log sigmoid(-(...)),
//                                    gamma = simpo_gamma (TRL's CPOTrainer with loss_type simpo, cpo_alpha 0)
//   orpo (ORPO, Hong et al. 2024):   NLL(chosen) - beta log sigmoid(log odds(a_w) - log odds(a_l)),
//                                    log odds(a) = a - log(1 - exp(a)), NLL the chosen tokens' mean (TRL's
//                                    ORPOTrainer): supervised fine-tuning and the preference in one loss
// Their implicit reward (the metrics' rewards/*) is beta a, as TRL logs it. Prompts are encoded as SFT and the
// RL trainer encode them (prompt_encoder.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hybridflow/finetune/fine_tune_options.h"
#include "hybridflow/model/tokenizer.h"
#include "hybridflow/model/transformer.h"

namespace hybridflow {

enum class DpoLossType { kSigmoid, kIpo, kSimpo, kOrpo };
DpoLossType parse_dpo_loss_type(const std::string& value);  // unknown -> Error naming dpo.loss_type
// simpo and orpo: no reference model.
bool dpo_loss_is_reference_free(DpoLossType type);

struct DpoOptions : FineTuneOptions {
  // train_file / eval_file rows: {"prompt", "chosen", "rejected"}; metrics go to out_dir/dpo_metrics.jsonl.
  std::string model_dir;  // where a chat template comes from (apply_chat_template)
  bool apply_chat_template = false;
  bool add_bos = true;
  double beta = 0.1;
  double label_smoothing = 0;  // sigmoid and simpo: the assumed share of pairs whose preference is flipped
  DpoLossType loss_type = DpoLossType::kSigmoid;
  double simpo_gamma = 0.5;    // simpo: the target reward margin (TRL's default)
  int64_t max_new_tokens = 8;  // held-out greedy answers, scored against "chosen"
  // Scores a greedy response against the chosen one; default exact match after trimming whitespace.
  std::function<double(const std::string& response, const std::string& chosen)> scorer;
};

struct DpoMetrics {
  int64_t step = 0;
  double loss = 0;
  double reward_chosen = 0;    // mean implicit reward beta (log pi - log ref) of the chosen responses
  double reward_rejected = 0;
  double reward_accuracy = 0;  // share of this step's pairs whose chosen reward is the larger (before the update)
  double reward_margin = 0;    // mean chosen - rejected reward
  double grad_norm = 0;
  double lr = 0;
  int64_t pairs = 0;
  int64_t tokens = 0;          // response tokens (and eos) of the chosen and rejected sequences
  double seconds = 0;
  double eval_accuracy = -1;         // held-out greedy exact match against "chosen"; -1 when not evaluated
  double eval_reward_accuracy = -1;  // held-out pairs whose chosen implicit reward is the larger
};

struct DpoResult : FineTuneRunInfo {
  std::vector<DpoMetrics> history;    // one entry per step run (after resumed_step)
  int64_t steps = 0;
  double initial_eval_accuracy = -1;  // before the first update (of this run: at resumed_step)
  double final_eval_accuracy = -1;
};

// beta > 0 and label_smoothing in [0, 0.5): errors name dpo.beta / dpo.label_smoothing. train_dpo checks them
// before loading anything; the CLI as soon as it has read the config.
void check_dpo_options(const DpoOptions& options);

// SimPO's or ORPO's loss (see above): chosen_mean / rejected_mean [B] the responses' mean log-prob per token,
// chosen_nll the chosen tokens' mean negative log-likelihood (ORPO's; SimPO ignores it).
torch::Tensor reference_free_preference_loss(const torch::Tensor& chosen_mean, const torch::Tensor& rejected_mean,
                                             const torch::Tensor& chosen_nll, double beta, DpoLossType type,
                                             double label_smoothing = 0, double simpo_gamma = 0.5);

// The per-pair losses' mean; all four [B] sequence log-probabilities.
torch::Tensor dpo_loss(const torch::Tensor& policy_chosen, const torch::Tensor& policy_rejected,
                       const torch::Tensor& reference_chosen, const torch::Tensor& reference_rejected, double beta,
                       double label_smoothing = 0, DpoLossType type = DpoLossType::kSigmoid);

// Sum over each row of log p(targets) where loss_mask is 1: ids / mask / targets / loss_mask [B, T] right
// padded, targets[t] = ids[t + 1]. Returns [B] float32, differentiable when gradients are on.
torch::Tensor sequence_log_probs(CausalLM& model, const torch::Tensor& ids, const torch::Tensor& mask,
                                 const torch::Tensor& targets, const torch::Tensor& loss_mask);

using DpoProgressCallback = std::function<void(const DpoMetrics&)>;

// Trains `policy` in place against `reference` (frozen: its parameters take no gradient; the same
// vocabulary, usually the policy's starting weights). A null reference (CausalLM{nullptr}) is the policy with its
// LoRA adapters off, the base model without a second copy of its weights (the policy must have adapters). The
// reference-free losses (simpo, orpo) take no reference: pass a null one.
// Errors name the file and line of a bad row.
DpoResult train_dpo(const DpoOptions& options, CausalLM& policy, CausalLM& reference, const Tokenizer& tokenizer,
                    const DpoProgressCallback& progress = {});

}  // namespace hybridflow
