// Reward (or cost) model training on preference pairs with the Bradley-Terry loss
// -log sigmoid(r_chosen - r_rejected), where r is the value head's score at the last token of
// bos + prompt + response + eos: the same position the RL trainer's reward_model / cost_model workers
// read (RewardModelWorker::compute_rm_score), so a model trained here scores rollouts as it was trained.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hybridflow/finetune/fine_tune_options.h"
#include "hybridflow/model/tokenizer.h"
#include "hybridflow/model/transformer.h"
#include "hybridflow/tasks/dataset.h"

namespace hybridflow {

struct RewardModelOptions : FineTuneOptions {
  // train_file / eval_file rows: {"prompt", "chosen", "rejected"}; a row is a pair; metrics go to
  // out_dir/rm_metrics.jsonl.
  bool add_bos = true;  // must match the RL run's data.add_bos
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

struct RewardModelResult {
  std::vector<RewardModelMetrics> history;
  int64_t steps = 0;
  double initial_eval_accuracy = -1;  // before the first update
  double final_eval_accuracy = -1;
};

// Mean over pairs of -log sigmoid(chosen - rejected); both [B].
torch::Tensor bradley_terry_loss(const torch::Tensor& chosen_scores, const torch::Tensor& rejected_scores);

// Token ids the model scores for one prompt/response: [bos] + prompt + response + eos.
std::vector<int64_t> reward_sequence(const Tokenizer& tokenizer, const std::string& prompt,
                                     const std::string& response, bool add_bos);

// Value-head scores [B] at the last token of each sequence (right padded internally).
torch::Tensor sequence_scores(CausalLM& model, const std::vector<std::vector<int64_t>>& sequences, int64_t pad_id);

// Share of pairs the model ranks correctly (r_chosen > r_rejected); 0 for no pairs.
double pairwise_accuracy(CausalLM& model, const Tokenizer& tokenizer, const std::vector<PreferencePair>& pairs,
                         bool add_bos = true);

using RewardModelProgressCallback = std::function<void(const RewardModelMetrics&)>;

// Trains `model` (built with HeadKind::kValue) in place. Errors name the file and line of a bad row.
RewardModelResult train_reward_model(const RewardModelOptions& options, CausalLM& model, const Tokenizer& tokenizer,
                                     const RewardModelProgressCallback& progress = {});

}  // namespace hybridflow
