#include "hybridflow/engine/sft.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/jsonl.h"
#include "hybridflow/core/logging.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/engine/log_probs.h"
#include "hybridflow/engine/fine_tune_options.h"
#include "hybridflow/engine/shuffled_batches.h"
#include "hybridflow/engine/train_engine.h"
#include "hybridflow/model/pretrained.h"

namespace hybridflow {

namespace {

struct SftExample {
  std::vector<int64_t> prompt;    // bos + prompt
  std::vector<int64_t> response;  // response + eos
  std::string answer;
  std::string prompt_text;
};

std::vector<SftExample> load_examples(const std::string& path, const Tokenizer& tok) {
  std::vector<SftExample> out;
  auto rows = read_jsonl(path);
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    const std::string where = path + ": row " + std::to_string(i + 1);
    HF_CHECK(row.is_object() && row.contains("prompt") && row["prompt"].is_string(), where,
             ": expected a string \"prompt\"");
    const char* key = row.contains("response") ? "response" : "answer";
    HF_CHECK(row.contains(key) && row[key].is_string(), where, ": expected a string \"response\" or \"answer\"");
    SftExample ex;
    ex.prompt_text = row["prompt"].get<std::string>();
    ex.answer = row[key].get<std::string>();
    try {
      ex.prompt = tok.encode(ex.prompt_text, /*add_bos=*/true);
      ex.response = tok.encode(ex.answer);
    } catch (const Error& e) {
      HF_FAIL(where, ": ", e.what());
    }
    ex.response.push_back(tok.eos_id());
    out.push_back(std::move(ex));
  }
  HF_CHECK(!out.empty(), path, ": no examples");
  return out;
}

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

// Writes the whole directory under a temporary name and renames it, so a crash never leaves a
// half-written checkpoint that looks complete.
std::string save_checkpoint(const std::string& out_dir, int64_t step, const CausalLM& model, const Tokenizer& tok,
                            const TrainEngine& engine) {
  namespace fs = std::filesystem;
  const std::string final_dir = checkpoint_dir(out_dir, step);
  const std::string tmp_dir = final_dir + ".tmp";
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
  make_dirs(tmp_dir);
  save_pretrained(tmp_dir, model, tok);
  engine.save_state(tmp_dir + "/optimizer.pt");
  fs::remove_all(final_dir, ec);
  fs::rename(tmp_dir, final_dir, ec);
  HF_CHECK(!ec, "could not rename checkpoint '", tmp_dir, "' to '", final_dir, "': ", ec.message());
  return final_dir;
}

}  // namespace

std::string checkpoint_dir(const std::string& out_dir, int64_t step) {
  return out_dir + "/checkpoint-" + std::to_string(step);
}

double evaluate_exact_match(CausalLM& model, const Tokenizer& tok, const std::vector<std::string>& prompts,
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
  double total = 0;
  const size_t chunk = 128;
  for (size_t begin = 0; begin < prompts.size(); begin += chunk) {
    const size_t end = std::min(prompts.size(), begin + chunk);
    std::vector<std::vector<int64_t>> ids;
    for (size_t i = begin; i < end; ++i) ids.push_back(tok.encode(prompts[i], /*add_bos=*/true));
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
  const auto train = load_examples(o.train_file, tok);
  std::vector<std::string> eval_prompts, eval_answers;
  if (!o.eval_file.empty()) {
    for (const auto& ex : load_examples(o.eval_file, tok)) {
      if (static_cast<int64_t>(eval_prompts.size()) >= o.eval_samples) break;
      eval_prompts.push_back(ex.prompt_text);
      eval_answers.push_back(ex.answer);
    }
  }
  const int64_t n = static_cast<int64_t>(train.size());
  const int64_t total_steps = fine_tune_total_steps(o, n);

  TrainEngine engine(model.ptr(), fine_tune_optimizer(o, total_steps));

  MicroLossFn loss_fn = [&model](const DataProto& micro) {
    // Trim the micro-batch to its longest row: right padding only costs compute.
    const int64_t len = micro.tensor("attention_mask").sum(1).max().item<int64_t>();
    auto ids = micro.tensor("input_ids").narrow(1, 0, len);
    auto mask = micro.tensor("attention_mask").narrow(1, 0, len);
    auto loss_mask = micro.tensor("loss_mask").narrow(1, 0, len).to(torch::kFloat);
    auto logits = model->forward(ids, mask).logits;
    auto lp = token_log_probs(logits, micro.tensor("targets").narrow(1, 0, len), /*with_entropy=*/false).log_probs;
    return -(lp * loss_mask).sum() / loss_mask.sum();
  };

  SftResult result;
  ShuffledBatches batches(n, o.batch_size, o.seed);
  const auto start = std::chrono::steady_clock::now();
  if (!o.out_dir.empty()) make_dirs(o.out_dir);
  model->train();
  for (int64_t step = 1; step <= total_steps; ++step) {
    const std::vector<int64_t> rows = batches.next();
    StepStats stats = engine.train_step(make_batch(train, rows, tok.pad_id()), o.micro_batch_size, loss_fn);
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
    if (!o.out_dir.empty() && ((o.save_every > 0 && step % o.save_every == 0) || last)) {
      result.last_checkpoint = save_checkpoint(o.out_dir, step, model, tok, engine);
    }
    m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!o.out_dir.empty()) {
      nlohmann::json row = {{"step", m.step},       {"loss", m.loss}, {"grad_norm", m.grad_norm},
                            {"lr", m.lr},           {"seconds", m.seconds}};
      if (m.eval_accuracy >= 0) row["eval_accuracy"] = m.eval_accuracy;
      append_jsonl(o.out_dir + "/sft_metrics.jsonl", row);
    }
    result.history.push_back(m);
    if (progress) progress(m);
  }
  result.steps = total_steps;
  return result;
}

}  // namespace hybridflow
