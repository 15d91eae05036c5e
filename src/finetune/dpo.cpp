#include "hybridflow/finetune/dpo.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "hybridflow/core/data_proto.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/jsonl.h"
#include "hybridflow/engine/head_log_probs.h"
#include "hybridflow/engine/prompt_encoder.h"
#include "hybridflow/engine/shuffled_batches.h"
#include "hybridflow/engine/train_engine.h"
#include "hybridflow/finetune/fine_tune_checkpoint.h"
#include "hybridflow/finetune/preference_rows.h"
#include "hybridflow/finetune/sft.h"

namespace hybridflow {

namespace {

struct EncodedPair {
  std::vector<int64_t> prompt;
  std::vector<int64_t> chosen;    // the response's ids + eos
  std::vector<int64_t> rejected;  // the same
  std::string chosen_text;
};

std::vector<EncodedPair> load_pairs(const std::string& path, const Tokenizer& tok, PromptEncoder& prompts,
                                    int64_t limit) {
  std::vector<EncodedPair> out;
  for (const PreferenceRow& row : read_preference_rows(path)) {
    if (static_cast<int64_t>(out.size()) >= limit) break;
    EncodedPreference encoded = encode_preference_row(row, tok, prompts);
    out.push_back({std::move(encoded.prompt), std::move(encoded.chosen), std::move(encoded.rejected), row.chosen});
  }
  return out;
}

// One side (chosen or rejected) of a batch of pairs, right padded to `len`, as SFT's batches: targets are the
// next tokens and loss_mask marks the response's tokens (eos included).
struct SideTensors {
  torch::Tensor ids, mask, targets, loss_mask;
};
SideTensors side_tensors(const std::vector<EncodedPair>& data, const std::vector<int64_t>& rows, bool chosen,
                         int64_t len, int64_t pad_id) {
  const int64_t b = static_cast<int64_t>(rows.size());
  SideTensors s{torch::full({b, len}, pad_id, torch::kLong), torch::zeros({b, len}, torch::kLong),
                torch::full({b, len}, pad_id, torch::kLong), torch::zeros({b, len}, torch::kLong)};
  auto ids = s.ids.accessor<int64_t, 2>(), mask = s.mask.accessor<int64_t, 2>();
  auto targets = s.targets.accessor<int64_t, 2>(), loss = s.loss_mask.accessor<int64_t, 2>();
  for (int64_t r = 0; r < b; ++r) {
    const EncodedPair& p = data[static_cast<size_t>(rows[static_cast<size_t>(r)])];
    std::vector<int64_t> seq = p.prompt;
    const auto& response = chosen ? p.chosen : p.rejected;
    seq.insert(seq.end(), response.begin(), response.end());
    const auto prompt_len = static_cast<int64_t>(p.prompt.size());
    for (int64_t t = 0; t + 1 < static_cast<int64_t>(seq.size()); ++t) {
      ids[r][t] = seq[static_cast<size_t>(t)];
      targets[r][t] = seq[static_cast<size_t>(t + 1)];
      mask[r][t] = 1;
      loss[r][t] = t + 1 >= prompt_len ? 1 : 0;
    }
  }
  return s;
}

int64_t longest_pair(const std::vector<EncodedPair>& data, const std::vector<int64_t>& rows) {
  size_t len = 1;
  for (int64_t r : rows) {
    const EncodedPair& p = data[static_cast<size_t>(r)];
    len = std::max(len, p.prompt.size() + std::max(p.chosen.size(), p.rejected.size()) - 1);
  }
  return static_cast<int64_t>(len);
}

// Chosen and rejected of the same pairs side by side in a row (a micro-batch never splits a pair), with the
// reference's log-probs of both.
DataProto pair_batch(const std::vector<EncodedPair>& data, const std::vector<int64_t>& rows, int64_t pad_id) {
  const int64_t len = longest_pair(data, rows);
  DataProto batch;
  for (bool chosen : {true, false}) {
    const SideTensors s = side_tensors(data, rows, chosen, len, pad_id);
    const std::string side = chosen ? "chosen" : "rejected";
    batch.set_tensor(side + "_ids", s.ids);
    batch.set_tensor(side + "_mask", s.mask);
    batch.set_tensor(side + "_targets", s.targets);
    batch.set_tensor(side + "_response_mask", s.loss_mask);
  }
  return batch;
}

// Both sides' sequence log-probs in one forward: [B] chosen, [B] rejected.
std::pair<torch::Tensor, torch::Tensor> pair_log_probs(CausalLM& model, const DataProto& b) {
  auto cat = [&](const std::string& key) {
    return torch::cat({b.tensor("chosen_" + key), b.tensor("rejected_" + key)});
  };
  const torch::Tensor both = sequence_log_probs(model, cat("ids"), cat("mask"), cat("targets"), cat("response_mask"));
  const int64_t n = b.batch_size();
  return {both.narrow(0, 0, n), both.narrow(0, n, n)};
}

// Mean log-prob per response token (eos included) of each pair's side: [B].
torch::Tensor mean_log_probs(const torch::Tensor& sums, const DataProto& b, const std::string& side) {
  return sums / b.tensor(side + "_response_mask").sum(1).to(sums.dtype()).clamp_min(1);
}

// Each side's implicit reward [B]: beta (log pi - log ref) of the sequence, or for the reference-free losses beta
// times the mean log-prob per token (TRL's rewards/* for CPO / SimPO and ORPO).
std::pair<torch::Tensor, torch::Tensor> implicit_rewards(const DpoOptions& o, const torch::Tensor& chosen,
                                                         const torch::Tensor& rejected, const DataProto& b) {
  if (dpo_loss_is_reference_free(o.loss_type))
    return {o.beta * mean_log_probs(chosen, b, "chosen"), o.beta * mean_log_probs(rejected, b, "rejected")};
  return {o.beta * (chosen - b.tensor("reference_chosen")), o.beta * (rejected - b.tensor("reference_rejected"))};
}

// The reference's log-probs of both sides (none for a reference-free loss). A null reference is the policy with
// its LoRA adapters off: the base model, without a second copy of its weights.
void add_reference_log_probs(const DpoOptions& o, CausalLM& policy, CausalLM& reference, DataProto& batch) {
  if (dpo_loss_is_reference_free(o.loss_type)) return;
  torch::NoGradGuard no_grad;
  const bool adapters_off = !reference;
  if (adapters_off) policy->set_lora_enabled(false);
  auto [chosen, rejected] = pair_log_probs(adapters_off ? policy : reference, batch);
  if (adapters_off) policy->set_lora_enabled(true);
  batch.set_tensor("reference_chosen", chosen);
  batch.set_tensor("reference_rejected", rejected);
}

// Held-out pairs whose chosen response gets the larger implicit reward.
double reward_accuracy(const DpoOptions& o, CausalLM& policy, CausalLM& reference, const std::vector<EncodedPair>& pairs,
                       int64_t pad_id, const torch::Device& device) {
  if (pairs.empty()) return 0.0;
  torch::NoGradGuard no_grad;
  const bool was_training = policy->is_training();
  policy->eval();
  int64_t correct = 0;
  const int64_t chunk = 64, n = static_cast<int64_t>(pairs.size());
  for (int64_t begin = 0; begin < n; begin += chunk) {
    std::vector<int64_t> rows;
    for (int64_t i = begin; i < std::min(n, begin + chunk); ++i) rows.push_back(i);
    DataProto batch = pair_batch(pairs, rows, pad_id).to(device);
    add_reference_log_probs(o, policy, reference, batch);
    auto [chosen, rejected] = pair_log_probs(policy, batch);
    const auto [reward_chosen, reward_rejected] = implicit_rewards(o, chosen, rejected, batch);
    correct += reward_chosen.gt(reward_rejected).sum().item<int64_t>();
  }
  if (was_training) policy->train();
  return static_cast<double>(correct) / static_cast<double>(n);
}

}  // namespace

DpoLossType parse_dpo_loss_type(const std::string& value) {
  if (value == "sigmoid") return DpoLossType::kSigmoid;
  if (value == "ipo") return DpoLossType::kIpo;
  if (value == "simpo") return DpoLossType::kSimpo;
  if (value == "orpo") return DpoLossType::kOrpo;
  HF_FAIL("dpo.loss_type: expected sigmoid, ipo, simpo or orpo, got '", value, "'");
}

bool dpo_loss_is_reference_free(DpoLossType type) { return type == DpoLossType::kSimpo || type == DpoLossType::kOrpo; }

void check_dpo_options(const DpoOptions& o) {
  HF_CHECK(o.beta > 0, "dpo.beta must be > 0, got ", o.beta);
  HF_CHECK(o.label_smoothing >= 0 && o.label_smoothing < 0.5, "dpo.label_smoothing must be in [0, 0.5), got ",
           o.label_smoothing);
  HF_CHECK(std::isfinite(o.simpo_gamma), "dpo.simpo_gamma must be a finite number, got ", o.simpo_gamma);
}

torch::Tensor reference_free_preference_loss(const torch::Tensor& chosen_mean, const torch::Tensor& rejected_mean,
                                             const torch::Tensor& chosen_nll, double beta, DpoLossType type,
                                             double label_smoothing, double simpo_gamma) {
  HF_CHECK(dpo_loss_is_reference_free(type), "reference_free_preference_loss: dpo.loss_type sigmoid and ipo need ",
           "the reference's log-probs (dpo_loss)");
  HF_CHECK(chosen_mean.sizes() == rejected_mean.sizes(), "reference_free_preference_loss: chosen ", chosen_mean.sizes(),
           " and rejected ", rejected_mean.sizes(), " must have one shape");
  HF_CHECK(beta > 0, "dpo.beta must be > 0, got ", beta);
  if (type == DpoLossType::kSimpo) {
    const torch::Tensor logits = beta * (chosen_mean - rejected_mean) - simpo_gamma;
    torch::Tensor loss = -torch::log_sigmoid(logits) * (1.0 - label_smoothing);
    if (label_smoothing > 0) loss = loss - torch::log_sigmoid(-logits) * label_smoothing;
    return loss.mean();
  }
  // ORPO: log odds(a) = a - log(1 - exp(a)) with a < 0, log1p(-exp(a)) computed as log(-expm1(a)) near a = 0.
  const auto log_one_minus = [](const torch::Tensor& a) { return torch::log(-torch::expm1(a)); };
  const torch::Tensor log_odds =
      (chosen_mean - rejected_mean) - (log_one_minus(chosen_mean) - log_one_minus(rejected_mean));
  return chosen_nll - beta * torch::log_sigmoid(log_odds).mean();
}

torch::Tensor dpo_loss(const torch::Tensor& policy_chosen, const torch::Tensor& policy_rejected,
                       const torch::Tensor& reference_chosen, const torch::Tensor& reference_rejected, double beta,
                       double label_smoothing, DpoLossType type) {
  HF_CHECK(policy_chosen.sizes() == policy_rejected.sizes() && policy_chosen.sizes() == reference_chosen.sizes() &&
               policy_chosen.sizes() == reference_rejected.sizes(),
           "dpo_loss: the four log-probabilities must have one shape, got ", policy_chosen.sizes(), ", ",
           policy_rejected.sizes(), ", ", reference_chosen.sizes(), " and ", reference_rejected.sizes());
  HF_CHECK(beta > 0, "dpo.beta must be > 0, got ", beta);
  HF_CHECK(label_smoothing >= 0 && label_smoothing < 0.5, "dpo.label_smoothing must be in [0, 0.5), got ",
           label_smoothing);
  HF_CHECK(!dpo_loss_is_reference_free(type), "dpo_loss: dpo.loss_type simpo and orpo take no reference ",
           "(reference_free_preference_loss)");
  const torch::Tensor margin = (policy_chosen - reference_chosen) - (policy_rejected - reference_rejected);
  if (type == DpoLossType::kIpo) return (margin - 1.0 / (2.0 * beta)).pow(2).mean();
  const torch::Tensor scaled = beta * margin;
  torch::Tensor loss = -torch::log_sigmoid(scaled) * (1.0 - label_smoothing);
  if (label_smoothing > 0) loss = loss - torch::log_sigmoid(-scaled) * label_smoothing;
  return loss.mean();
}

torch::Tensor sequence_log_probs(CausalLM& model, const torch::Tensor& ids, const torch::Tensor& mask,
                                 const torch::Tensor& targets, const torch::Tensor& loss_mask) {
  HF_CHECK(ids.dim() == 2 && mask.sizes() == ids.sizes() && targets.sizes() == ids.sizes() &&
               loss_mask.sizes() == ids.sizes(),
           "sequence_log_probs: ids ", ids.sizes(), ", mask ", mask.sizes(), ", targets ", targets.sizes(),
           " and loss_mask ", loss_mask.sizes(), " must all be [B, T]");
  // Right padding only costs compute: trim to the longest row.
  const int64_t len = std::max<int64_t>(1, mask.sum(1).max().item<int64_t>());
  const torch::Tensor at = loss_mask.narrow(1, 0, len).to(torch::kBool);
  const torch::Tensor hidden = model->hidden_states(ids.narrow(1, 0, len), mask.narrow(1, 0, len)).index({at});
  // The head only at the response's positions, a chunk at a time (head_log_probs.h).
  const torch::Tensor lp = head_log_probs(hidden, model->lm_head_weight(), targets.narrow(1, 0, len).index({at}), 1.0,
                                          /*with_entropy=*/false, model->tensor_parallel())
                               .log_probs;
  const auto i64 = torch::TensorOptions().dtype(torch::kLong).device(ids.device());
  const torch::Tensor row = torch::arange(ids.size(0), i64).unsqueeze(1).expand({ids.size(0), len}).index({at});
  return torch::zeros({ids.size(0)}, lp.options()).index_add(0, row, lp);
}

DpoResult train_dpo(const DpoOptions& o, CausalLM& policy, CausalLM& reference, const Tokenizer& tok,
                    const DpoProgressCallback& progress) {
  HF_CHECK(policy->head_kind() == HeadKind::kLanguageModel, "dpo: the policy needs a language-model head");
  if (dpo_loss_is_reference_free(o.loss_type)) {
    // simpo / orpo: no reference model is read, whatever was passed.
  } else if (reference) {
    HF_CHECK(reference->head_kind() == HeadKind::kLanguageModel, "dpo: the reference needs a language-model head");
    HF_CHECK(policy->config().vocab_size == reference->config().vocab_size, "dpo: the policy's vocabulary (",
             policy->config().vocab_size, ") and the reference's (", reference->config().vocab_size, ") differ");
  } else {
    HF_CHECK(policy->has_lora() && !policy->lora_merged(), "dpo: without a reference model the reference is the ",
             "policy with its LoRA adapters off, and this policy has no (unmerged) adapters");
  }
  HF_CHECK(!o.train_file.empty(), "dpo: train_file is not set");
  HF_CHECK(o.batch_size > 0 && o.micro_batch_size > 0, "dpo: batch_size (", o.batch_size, ") and micro_batch_size (",
           o.micro_batch_size, ") must be > 0");
  check_dpo_options(o);
  PromptEncoder prompts(tok, o.model_dir, preference_prompt_options(o.apply_chat_template, o.add_bos));
  const auto train = load_pairs(o.train_file, tok, prompts, std::numeric_limits<int64_t>::max());
  const auto held_out = o.eval_file.empty() ? std::vector<EncodedPair>() : load_pairs(o.eval_file, tok, prompts, o.eval_samples);
  std::vector<std::vector<int64_t>> eval_prompts;
  std::vector<std::string> eval_answers;
  for (const auto& p : held_out) {
    eval_prompts.push_back(p.prompt);
    eval_answers.push_back(p.chosen_text);
  }
  const int64_t n = static_cast<int64_t>(train.size());
  const int64_t total_steps = fine_tune_total_steps(o, n);

  if (reference) {
    for (auto& p : reference->parameters()) p.set_requires_grad(false);
    reference->eval();
  }
  TrainEngine engine(policy.ptr(), fine_tune_optimizer(o, total_steps));
  const torch::Device device = policy->parameters().front().device();  // batches are made on the CPU

  double chosen_sum = 0, rejected_sum = 0;
  int64_t correct = 0;
  MicroLossFn loss_fn = [&](const DataProto& micro) {
    auto [chosen, rejected] = pair_log_probs(policy, micro);
    const auto [reward_chosen, reward_rejected] = implicit_rewards(o, chosen.detach(), rejected.detach(), micro);
    chosen_sum += reward_chosen.sum().item<double>();
    rejected_sum += reward_rejected.sum().item<double>();
    correct += reward_chosen.gt(reward_rejected).sum().item<int64_t>();
    if (dpo_loss_is_reference_free(o.loss_type)) {
      const torch::Tensor chosen_tokens = micro.tensor("chosen_response_mask").sum().to(chosen.dtype());
      return reference_free_preference_loss(mean_log_probs(chosen, micro, "chosen"),
                                            mean_log_probs(rejected, micro, "rejected"),
                                            -chosen.sum() / chosen_tokens.clamp_min(1), o.beta, o.loss_type,
                                            o.label_smoothing, o.simpo_gamma);
    }
    return dpo_loss(chosen, rejected, micro.tensor("reference_chosen"), micro.tensor("reference_rejected"), o.beta,
                    o.label_smoothing, o.loss_type);
  };
  auto evaluate = [&](DpoMetrics* m) {
    m->eval_accuracy = evaluate_exact_match(policy, tok, eval_prompts, eval_answers, o.max_new_tokens, o.scorer);
    m->eval_reward_accuracy = reward_accuracy(o, policy, reference, held_out, tok.pad_id(), device);
    policy->train();
  };

  DpoResult result;
  if (!o.out_dir.empty()) make_dirs(o.out_dir);
  const std::string metrics_file = o.out_dir.empty() ? "" : o.out_dir + "/dpo_metrics.jsonl";
  FineTuneCheckpoints checkpoints(o, policy, tok, engine, metrics_file, total_steps);
  if (!held_out.empty()) {
    DpoMetrics before;
    evaluate(&before);
    result.initial_eval_accuracy = before.eval_accuracy;
  }
  ShuffledBatches batches(n, o.batch_size, o.seed);
  batches.skip(checkpoints.resumed_step());
  const auto start = std::chrono::steady_clock::now();
  policy->train();
  for (int64_t step = checkpoints.resumed_step() + 1; step <= total_steps; ++step) {
    const std::vector<int64_t> rows = batches.next();
    chosen_sum = rejected_sum = 0;
    correct = 0;
    // No "loss_mask" tensor: the engine weights micro-batches by pairs, so the step's loss is the batch mean.
    DataProto batch = pair_batch(train, rows, tok.pad_id()).to(device);
    add_reference_log_probs(o, policy, reference, batch);
    const StepStats stats = engine.train_step(batch, o.micro_batch_size, loss_fn);
    DpoMetrics m;
    m.step = step;
    m.loss = stats.loss;
    m.grad_norm = stats.grad_norm;
    m.lr = stats.lr;
    m.pairs = static_cast<int64_t>(rows.size());
    m.tokens = (batch.tensor("chosen_response_mask").sum() + batch.tensor("rejected_response_mask").sum()).item<int64_t>();
    const auto pairs = static_cast<double>(rows.size());
    m.reward_chosen = chosen_sum / pairs;
    m.reward_rejected = rejected_sum / pairs;
    m.reward_margin = m.reward_chosen - m.reward_rejected;
    m.reward_accuracy = static_cast<double>(correct) / pairs;
    if (!held_out.empty() && ((o.eval_every > 0 && step % o.eval_every == 0) || step == total_steps)) {
      evaluate(&m);
      result.final_eval_accuracy = m.eval_accuracy;
    }
    m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!o.out_dir.empty()) {
      nlohmann::json row = {{"step", m.step},
                            {"loss", m.loss},
                            {"rewards/chosen", m.reward_chosen},
                            {"rewards/rejected", m.reward_rejected},
                            {"rewards/accuracies", m.reward_accuracy},
                            {"rewards/margins", m.reward_margin},
                            {"grad_norm", m.grad_norm},
                            {"lr", m.lr},
                            {"seconds", m.seconds}};
      if (m.eval_accuracy >= 0) {
        row["eval_accuracy"] = m.eval_accuracy;
        row["eval_rewards/accuracies"] = m.eval_reward_accuracy;
      }
      append_jsonl(metrics_file, row);
    }
    result.history.push_back(m);
    if (progress) progress(m);
    if (checkpoints.after_step(step)) break;
  }
  static_cast<FineTuneRunInfo&>(result) = checkpoints.info();
  policy->eval();
  result.steps = total_steps;
  return result;
}

}  // namespace hybridflow
