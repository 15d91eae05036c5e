// Reward (or cost) model training on preference pairs with the Bradley-Terry loss
// -log sigmoid(r_chosen - r_rejected), where r is the value head's score at the last token of
// prompt + response + eos, the prompt encoded as the actor sees it (bos + text, or the chat template's
// rendering): the same position the RL trainer's reward_model / cost_model workers
// read (RewardModelWorker::compute_rm_score), so a model trained here scores rollouts as it was trained.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hybridflow/finetune/fine_tune_options.h"
#include "hybridflow/finetune/preference_rows.h"
#include "hybridflow/model/tokenizer.h"
#include "hybridflow/model/transformer.h"

namespace hybridflow {

struct RewardModelOptions : FineTuneOptions {
  // train_file / eval_file: preference pairs in TRL's formats, JSONL or parquet (finetune/preference_rows.h); a
  // prompt is encoded as the RL trainer's actor sees it, so the score is read where the RL run reads it.
  // Metrics go to out_dir/rm_metrics.jsonl.
  std::string model_dir;             // where a chat template comes from (chat prompts, apply_chat_template)
  bool apply_chat_template = false;  // plain-string prompts as a user message through the template
  bool add_bos = true;               // must match the RL run's data.add_bos
};

struct RewardModelMetrics {
  int64_t step = 0;
  double loss = 0;
  double accuracy = 0;  // share of this step's pairs with r_chosen > r_rejected (before the update)
  double margin = 0;    // mean r_chosen - r_rejected on this step's pairs
  double grad_norm = 0;
  double lr = 0;
  int64_t pairs = 0;
  int64_t tokens = 0;  // real tokens of this step's chosen and rejected sequences
  double seconds = 0;
  double eval_accuracy = -1;  // held-out pairwise accuracy; -1 when not evaluated at this step
};

struct RewardModelResult : FineTuneRunInfo {
  std::vector<RewardModelMetrics> history;  // one entry per step run (after resumed_step)
  int64_t steps = 0;
  double initial_eval_accuracy = -1;  // before the first update (of this run: at resumed_step)
  double final_eval_accuracy = -1;
};

// Mean over pairs of -log sigmoid(chosen - rejected); both [B].
torch::Tensor bradley_terry_loss(const torch::Tensor& chosen_scores, const torch::Tensor& rejected_scores);

// The token ids the model scores for both sides of a pair: the prompt as the actor sees it, the response, eos.
struct ScoredPair {
  std::vector<int64_t> chosen, rejected;
};
ScoredPair reward_sequences(const PreferenceRow& row, const Tokenizer& tokenizer, PromptEncoder& prompts);

// Value-head scores [B] at the last token of each sequence (right padded internally).
torch::Tensor sequence_scores(CausalLM& model, const std::vector<std::vector<int64_t>>& sequences, int64_t pad_id);

// Share of the file's pairs the model ranks correctly (r_chosen > r_rejected), their prompts encoded as training
// with `encoding` encodes them (model_dir, apply_chat_template, add_bos).
double pairwise_accuracy(CausalLM& model, const Tokenizer& tokenizer, const std::string& pairs_file,
                         const RewardModelOptions& encoding = {});

using RewardModelProgressCallback = std::function<void(const RewardModelMetrics&)>;

// Trains `model` (built with HeadKind::kValue) in place. Errors name the file and line of a bad row.
RewardModelResult train_reward_model(const RewardModelOptions& options, CausalLM& model, const Tokenizer& tokenizer,
                                     const RewardModelProgressCallback& progress = {});

}  // namespace hybridflow
