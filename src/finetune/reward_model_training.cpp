#include "hybridflow/finetune/reward_model_training.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <nlohmann/json.hpp>

#include "hybridflow/core/data_proto.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/jsonl.h"
#include "hybridflow/finetune/fine_tune_checkpoint.h"
#include "hybridflow/finetune/fine_tune_options.h"
#include "hybridflow/finetune/preference_rows.h"
#include "hybridflow/engine/shuffled_batches.h"
#include "hybridflow/engine/train_engine.h"

namespace hybridflow {

namespace {

std::vector<ScoredPair> load_scored_pairs(const std::string& path, const Tokenizer& tok, PromptEncoder& prompts,
                                          int64_t limit) {
  std::vector<ScoredPair> out;
  for (const PreferenceRow& row : read_preference_rows(path)) {
    if (static_cast<int64_t>(out.size()) >= limit) break;
    out.push_back(reward_sequences(row, tok, prompts));
  }
  return out;
}

PromptOptions prompt_options_of(const RewardModelOptions& o) {
  return preference_prompt_options(o.apply_chat_template, o.add_bos);
}

// [B, T] ids right padded with pad_id and the matching attention mask.
std::pair<torch::Tensor, torch::Tensor> pad_right(const std::vector<const std::vector<int64_t>*>& seqs, int64_t pad_id) {
  size_t len = 1;
  for (const auto* s : seqs) len = std::max(len, s->size());
  const int64_t B = static_cast<int64_t>(seqs.size());
  auto ids = torch::full({B, static_cast<int64_t>(len)}, pad_id, torch::kLong);
  auto mask = torch::zeros({B, static_cast<int64_t>(len)}, torch::kLong);
  auto ids_a = ids.accessor<int64_t, 2>();
  auto mask_a = mask.accessor<int64_t, 2>();
  for (int64_t b = 0; b < B; ++b)
    for (size_t t = 0; t < seqs[b]->size(); ++t) {
      ids_a[b][static_cast<int64_t>(t)] = (*seqs[b])[t];
      mask_a[b][static_cast<int64_t>(t)] = 1;
    }
  return {ids, mask};
}

// Scores at the last real token of right-padded rows, with gradient when enabled.
torch::Tensor last_token_scores(CausalLM& model, const torch::Tensor& ids, const torch::Tensor& mask) {
  auto values = model->forward(ids, mask).values;  // [B, T]
  auto last = (mask.sum(1) - 1).clamp_min(0).unsqueeze(1);
  return values.gather(1, last).squeeze(1);
}

// Chosen and rejected rows of a batch of pairs stacked into one forward: [2B, T], chosen first.
DataProto pair_batch(const std::vector<ScoredPair>& data, const std::vector<int64_t>& rows, int64_t pad_id) {
  std::vector<const std::vector<int64_t>*> chosen, rejected;
  for (int64_t r : rows) {
    chosen.push_back(&data[static_cast<size_t>(r)].chosen);
    rejected.push_back(&data[static_cast<size_t>(r)].rejected);
  }
  auto [c_ids, c_mask] = pad_right(chosen, pad_id);
  auto [r_ids, r_mask] = pad_right(rejected, pad_id);
  DataProto batch;
  batch.set_tensor("chosen_ids", c_ids);
  batch.set_tensor("chosen_mask", c_mask);
  batch.set_tensor("rejected_ids", r_ids);
  batch.set_tensor("rejected_mask", r_mask);
  return batch;
}

double accuracy_of(CausalLM& model, const std::vector<ScoredPair>& pairs, int64_t pad_id) {
  if (pairs.empty()) return 0.0;
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  int64_t correct = 0;
  const size_t chunk = 64;
  for (size_t begin = 0; begin < pairs.size(); begin += chunk) {
    std::vector<std::vector<int64_t>> chosen, rejected;
    for (size_t i = begin; i < std::min(pairs.size(), begin + chunk); ++i) {
      chosen.push_back(pairs[i].chosen);
      rejected.push_back(pairs[i].rejected);
    }
    correct += (sequence_scores(model, chosen, pad_id) > sequence_scores(model, rejected, pad_id)).sum().item<int64_t>();
  }
  if (was_training) model->train();
  return static_cast<double>(correct) / static_cast<double>(pairs.size());
}

}  // namespace

torch::Tensor bradley_terry_loss(const torch::Tensor& chosen_scores, const torch::Tensor& rejected_scores) {
  HF_CHECK(chosen_scores.sizes() == rejected_scores.sizes(), "bradley_terry_loss: chosen scores ",
           chosen_scores.sizes(), " and rejected scores ", rejected_scores.sizes(), " must have the same shape");
  return -torch::log_sigmoid(chosen_scores - rejected_scores).mean();
}

ScoredPair reward_sequences(const PreferenceRow& row, const Tokenizer& tokenizer, PromptEncoder& prompts) {
  const EncodedPreference e = encode_preference_row(row, tokenizer, prompts);
  ScoredPair pair{e.prompt, e.prompt};
  pair.chosen.insert(pair.chosen.end(), e.chosen.begin(), e.chosen.end());
  pair.rejected.insert(pair.rejected.end(), e.rejected.begin(), e.rejected.end());
  return pair;
}

torch::Tensor sequence_scores(CausalLM& model, const std::vector<std::vector<int64_t>>& sequences, int64_t pad_id) {
  std::vector<const std::vector<int64_t>*> ptrs;
  for (const auto& s : sequences) ptrs.push_back(&s);
  auto [ids, mask] = pad_right(ptrs, pad_id);
  const torch::Device device = model->parameters().front().device();
  return last_token_scores(model, ids.to(device), mask.to(device));
}

double pairwise_accuracy(CausalLM& model, const Tokenizer& tokenizer, const std::string& pairs_file,
                         const RewardModelOptions& encoding) {
  PromptEncoder prompts(tokenizer, encoding.model_dir, prompt_options_of(encoding));
  return accuracy_of(model, load_scored_pairs(pairs_file, tokenizer, prompts, std::numeric_limits<int64_t>::max()),
                     tokenizer.pad_id());
}

RewardModelResult train_reward_model(const RewardModelOptions& o, CausalLM& model, const Tokenizer& tok,
                                     const RewardModelProgressCallback& progress) {
  HF_CHECK(model->head_kind() == HeadKind::kValue, "reward model training needs a value-head model");
  HF_CHECK(!o.train_file.empty(), "rm: train_file is not set");
  HF_CHECK(o.batch_size > 0 && o.micro_batch_size > 0, "rm: batch_size (", o.batch_size, ") and micro_batch_size (",
           o.micro_batch_size, ") must be > 0");
  PromptEncoder prompts(tok, o.model_dir, prompt_options_of(o));
  const auto train = load_scored_pairs(o.train_file, tok, prompts, std::numeric_limits<int64_t>::max());
  const auto held_out =
      o.eval_file.empty() ? std::vector<ScoredPair>() : load_scored_pairs(o.eval_file, tok, prompts, o.eval_samples);
  const int64_t n = static_cast<int64_t>(train.size());
  const int64_t total_steps = fine_tune_total_steps(o, n);

  TrainEngine engine(model.ptr(), fine_tune_optimizer(o, total_steps));
  const torch::Device device = model->parameters().front().device();  // batches are made on the CPU

  int64_t correct = 0;
  double margin_sum = 0;
  MicroLossFn loss_fn = [&](const DataProto& micro) {
    auto chosen = last_token_scores(model, micro.tensor("chosen_ids"), micro.tensor("chosen_mask"));
    auto rejected = last_token_scores(model, micro.tensor("rejected_ids"), micro.tensor("rejected_mask"));
    const auto margin = (chosen - rejected).detach();
    correct += (margin > 0).sum().item<int64_t>();
    margin_sum += margin.sum().item<double>();
    return bradley_terry_loss(chosen, rejected);
  };

  RewardModelResult result;
  if (!o.out_dir.empty()) make_dirs(o.out_dir);
  const std::string metrics_file = o.out_dir.empty() ? "" : o.out_dir + "/rm_metrics.jsonl";
  FineTuneCheckpoints checkpoints(o, model, tok, engine, metrics_file, total_steps);
  if (!held_out.empty()) result.initial_eval_accuracy = accuracy_of(model, held_out, tok.pad_id());
  ShuffledBatches batches(n, o.batch_size, o.seed);
  batches.skip(checkpoints.resumed_step());
  const auto start = std::chrono::steady_clock::now();
  model->train();
  for (int64_t step = checkpoints.resumed_step() + 1; step <= total_steps; ++step) {
    const std::vector<int64_t> rows = batches.next();
    correct = 0;
    margin_sum = 0;
    // No "loss_mask" tensor: the engine weights micro-batches by pairs, so the step loss is the batch mean.
    const DataProto batch = pair_batch(train, rows, tok.pad_id()).to(device);
    StepStats stats = engine.train_step(batch, o.micro_batch_size, loss_fn);
    RewardModelMetrics m;
    m.step = step;
    m.loss = stats.loss;
    m.grad_norm = stats.grad_norm;
    m.lr = stats.lr;
    m.pairs = static_cast<int64_t>(rows.size());
    m.tokens = (batch.tensor("chosen_mask").sum() + batch.tensor("rejected_mask").sum()).item<int64_t>();
    m.accuracy = static_cast<double>(correct) / static_cast<double>(rows.size());
    m.margin = margin_sum / static_cast<double>(rows.size());
    if (!held_out.empty() && ((o.eval_every > 0 && step % o.eval_every == 0) || step == total_steps)) {
      m.eval_accuracy = accuracy_of(model, held_out, tok.pad_id());
      result.final_eval_accuracy = m.eval_accuracy;
    }
    m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!o.out_dir.empty()) {
      nlohmann::json row = {{"step", m.step},         {"loss", m.loss}, {"accuracy", m.accuracy},
                            {"margin", m.margin},     {"grad_norm", m.grad_norm},
                            {"lr", m.lr},             {"seconds", m.seconds}};
      if (m.eval_accuracy >= 0) row["eval_accuracy"] = m.eval_accuracy;
      append_jsonl(metrics_file, row);
    }
    result.history.push_back(m);
    if (progress) progress(m);
    if (checkpoints.after_step(step)) break;
  }
  static_cast<FineTuneRunInfo&>(result) = checkpoints.info();
  model->eval();
  result.steps = total_steps;
  return result;
}

}  // namespace hybridflow
