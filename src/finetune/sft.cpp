#include "hybridflow/finetune/sft.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/remove_tree.h"
#include "hybridflow/core/jsonl.h"
#include "hybridflow/core/logging.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/finetune/fine_tune_checkpoint.h"
#include "hybridflow/finetune/fine_tune_options.h"
#include "hybridflow/engine/head_log_probs.h"
#include "hybridflow/engine/prompt_encoder.h"
#include "hybridflow/engine/shuffled_batches.h"
#include "hybridflow/engine/train_engine.h"
#include "hybridflow/model/lora.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/tasks/prompt_rows.h"

namespace hybridflow {

namespace {

}  // namespace

std::vector<SftExample> read_sft_examples(const std::string& path, const Tokenizer& tok, PromptEncoder& prompts) {
  std::vector<SftExample> out;
  for (const PromptRow& row : read_prompt_rows(path)) {
    HF_CHECK(!row.answer.empty(), row.where, ": no target to train on (expected \"response\" or \"answer\", or ",
             "reward_model.ground_truth in verl's rows)");
    SftExample ex;
    ex.answer = row.answer;
    try {
      ex.prompt = prompts.encode_row(row, &ex.prompt_text);
      ex.response = tok.encode(ex.answer);
    } catch (const Error& e) {
      HF_FAIL(row.where, ": ", e.what());
    }
    ex.response.push_back(tok.eos_id());
    out.push_back(std::move(ex));
  }
  HF_CHECK(!out.empty(), path, ": no examples");
  return out;
}

namespace {

// Right-padded prompt+response; targets are the next tokens, loss only where the target is a
// response token (eos included).
DataProto make_batch(const std::vector<SftExample>& data, const std::vector<int64_t>& rows, int64_t pad_id) {
  int64_t len = 0;
  for (int64_t r : rows) len = std::max<int64_t>(len, data[r].prompt.size() + data[r].response.size() - 1);
  const int64_t B = static_cast<int64_t>(rows.size());
  auto ids = torch::full({B, len}, pad_id, torch::kLong);
  auto targets = torch::full({B, len}, pad_id, torch::kLong);
  auto mask = torch::zeros({B, len}, torch::kLong);
  auto loss_mask = torch::zeros({B, len}, torch::kLong);
  auto ids_a = ids.accessor<int64_t, 2>();
  auto tgt_a = targets.accessor<int64_t, 2>();
  auto mask_a = mask.accessor<int64_t, 2>();
  auto loss_a = loss_mask.accessor<int64_t, 2>();
  for (int64_t b = 0; b < B; ++b) {
    const auto& ex = data[rows[b]];
    std::vector<int64_t> seq = ex.prompt;
    seq.insert(seq.end(), ex.response.begin(), ex.response.end());
    const int64_t P = static_cast<int64_t>(ex.prompt.size());
    for (int64_t t = 0; t + 1 < static_cast<int64_t>(seq.size()); ++t) {
      ids_a[b][t] = seq[t];
      tgt_a[b][t] = seq[t + 1];
      mask_a[b][t] = 1;
      loss_a[b][t] = t + 1 >= P ? 1 : 0;
    }
  }
  DataProto batch;
  batch.set_tensor("input_ids", ids);
  batch.set_tensor("attention_mask", mask);
  batch.set_tensor("targets", targets);
  batch.set_tensor("loss_mask", loss_mask);
  return batch;
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

}  // namespace

double evaluate_exact_match(CausalLM& model, const Tokenizer& tok, const std::vector<std::vector<int64_t>>& prompts,
                            const std::vector<std::string>& answers, int64_t max_new_tokens,
                            const std::function<double(const std::string&, const std::string&)>& scorer) {
  HF_CHECK(prompts.size() == answers.size(), "evaluate_exact_match: ", prompts.size(), " prompts but ",
           answers.size(), " answers");
  if (prompts.empty()) return 0.0;
  GenerationConfig cfg;
  cfg.greedy = true;
  cfg.max_new_tokens = max_new_tokens;
  if (tok.eos_id() >= 0) cfg.eos_token_ids = {tok.eos_id()};
  cfg.pad_token_id = tok.pad_id();
  // A padded embedding's extra rows decode to nothing: the evaluation must not draw them.
  cfg.sampleable_vocab_size = std::min(tok.vocab_size(), model->config().vocab_size);
  double total = 0;
  const size_t chunk = 128;
  for (size_t begin = 0; begin < prompts.size(); begin += chunk) {
    const size_t end = std::min(prompts.size(), begin + chunk);
    std::vector<std::vector<int64_t>> ids(prompts.begin() + static_cast<std::ptrdiff_t>(begin),
                                          prompts.begin() + static_cast<std::ptrdiff_t>(end));
    GenerationOutput out = generate(model, ids, cfg);
    auto responses = out.responses.to(torch::kCPU);
    auto masks = out.response_mask.to(torch::kCPU);
    for (size_t i = begin; i < end; ++i) {
      std::vector<int64_t> tokens;
      const int64_t row = static_cast<int64_t>(i - begin);
      for (int64_t t = 0; t < responses.size(1); ++t) {
        if (masks[row][t].item<int64_t>() == 0) break;
        tokens.push_back(responses[row][t].item<int64_t>());
      }
      const std::string text = tok.decode(tokens, /*skip_special=*/true);
      total += scorer ? scorer(text, answers[i]) : (trim(text) == answers[i] ? 1.0 : 0.0);
    }
  }
  return total / static_cast<double>(prompts.size());
}

SftResult run_sft(const SftOptions& o, CausalLM& model, const Tokenizer& tok, const SftProgressCallback& progress) {
  HF_CHECK(!o.train_file.empty(), "sft: train_file is not set");
  HF_CHECK(o.batch_size > 0 && o.micro_batch_size > 0, "sft: batch_size (", o.batch_size, ") and micro_batch_size (",
           o.micro_batch_size, ") must be > 0");
  PromptOptions prompt_options;
  prompt_options.apply_chat_template = o.apply_chat_template;
  PromptEncoder prompts(tok, o.model_dir, prompt_options);
  const auto train = read_sft_examples(o.train_file, tok, prompts);
  std::vector<std::vector<int64_t>> eval_prompts;
  std::vector<std::string> eval_answers;
  if (!o.eval_file.empty()) {
    for (const auto& ex : read_sft_examples(o.eval_file, tok, prompts)) {
      if (static_cast<int64_t>(eval_prompts.size()) >= o.eval_samples) break;
      eval_prompts.push_back(ex.prompt);
      eval_answers.push_back(ex.answer);
    }
  }
  const int64_t n = static_cast<int64_t>(train.size());
  const int64_t total_steps = fine_tune_total_steps(o, n);

  TrainEngine engine(model.ptr(), fine_tune_optimizer(o, total_steps));
  const torch::Device device = model->parameters().front().device();  // batches are made on the CPU

  MicroLossFn loss_fn = [&model](const DataProto& micro) {
    // Trim the micro-batch to its longest row: right padding only costs compute.
    const int64_t len = micro.tensor("attention_mask").sum(1).max().item<int64_t>();
    auto ids = micro.tensor("input_ids").narrow(1, 0, len);
    auto mask = micro.tensor("attention_mask").narrow(1, 0, len);
    auto loss_mask = micro.tensor("loss_mask").narrow(1, 0, len).to(torch::kFloat);
    // The head only at the target positions, a chunk of them at a time (head_log_probs.h): a real
    // vocabulary (150k rows) over every prompt token would dominate time and memory.
    auto at_targets = loss_mask.to(torch::kBool);
    auto hidden = model->hidden_states(ids, mask).index({at_targets});
    auto targets = micro.tensor("targets").narrow(1, 0, len).index({at_targets});
    auto lp = head_log_probs(hidden, model->lm_head_weight(), targets, 1.0, /*with_entropy=*/false,
                             model->tensor_parallel())
                  .log_probs;
    return -lp.mean();
  };

  SftResult result;
  if (!o.out_dir.empty()) make_dirs(o.out_dir);
  const std::string metrics_file = o.out_dir.empty() ? "" : o.out_dir + "/sft_metrics.jsonl";
  FineTuneCheckpoints checkpoints(o, model, tok, engine, metrics_file, total_steps);
  ShuffledBatches batches(n, o.batch_size, o.seed);
  batches.skip(checkpoints.resumed_step());
  const auto start = std::chrono::steady_clock::now();
  model->train();
  for (int64_t step = checkpoints.resumed_step() + 1; step <= total_steps; ++step) {
    const std::vector<int64_t> rows = batches.next();
    StepStats stats = engine.train_step(make_batch(train, rows, tok.pad_id()).to(device), o.micro_batch_size, loss_fn);
    SftMetrics m;
    m.step = step;
    m.loss = stats.loss;
    m.grad_norm = stats.grad_norm;
    m.lr = stats.lr;
    m.tokens = stats.tokens;
    const bool last = step == total_steps;
    if (!eval_prompts.empty() && ((o.eval_every > 0 && step % o.eval_every == 0) || last)) {
      m.eval_accuracy = evaluate_exact_match(model, tok, eval_prompts, eval_answers, o.max_new_tokens, o.scorer);
      result.final_eval_accuracy = m.eval_accuracy;
      model->train();
    }
    m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!o.out_dir.empty()) {
      nlohmann::json row = {{"step", m.step},       {"loss", m.loss}, {"grad_norm", m.grad_norm},
                            {"lr", m.lr},           {"seconds", m.seconds}};
      if (m.eval_accuracy >= 0) row["eval_accuracy"] = m.eval_accuracy;
      append_jsonl(metrics_file, row);
    }
    result.history.push_back(m);
    if (progress) progress(m);
    if (checkpoints.after_step(step)) break;
  }
  static_cast<FineTuneRunInfo&>(result) = checkpoints.info();
  result.steps = total_steps;
  return result;
}

}  // namespace hybridflow
