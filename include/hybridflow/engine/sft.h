// Supervised fine-tuning on prompt/response pairs: loss on response tokens + eos only, padded
// batches, warm-up + decay schedule, periodic held-out exact-match evaluation by greedy decoding,
// and periodic checkpoints (a Hugging Face style model dir + optimizer state).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hybridflow/engine/fine_tune_options.h"
#include "hybridflow/model/tokenizer.h"
#include "hybridflow/model/transformer.h"

namespace hybridflow {

struct SftOptions : FineTuneOptions {
  // train_file / eval_file rows: {"prompt", "response"} (or "answer"); out_dir also receives the
  // checkpoints (out_dir/checkpoint-STEP) and the metrics go to out_dir/sft_metrics.jsonl.
  int64_t save_every = 0;  // steps between checkpoints (0 = only at the end, when out_dir is set)
  int64_t max_new_tokens = 16;
  // Scores a decoded response against the reference answer; default: exact match after trimming
  // whitespace (the built-in tasks' rule). Pass a Task's score to use its rule.
  std::function<double(const std::string& response, const std::string& answer)> scorer;
};

struct SftMetrics {
  int64_t step = 0;
  double loss = 0;
  double grad_norm = 0;
  double lr = 0;
  int64_t tokens = 0;          // loss tokens (response + eos) this step trained on
  double seconds = 0;          // since training started
  double eval_accuracy = -1;   // mean score on held-out examples; -1 when not evaluated at this step
};

struct SftResult {
  std::vector<SftMetrics> history;  // one entry per step
  int64_t steps = 0;
  double final_eval_accuracy = -1;
  std::string last_checkpoint;  // empty without out_dir
};

using SftProgressCallback = std::function<void(const SftMetrics&)>;

SftResult run_sft(const SftOptions& options, CausalLM& model, const Tokenizer& tokenizer,
                  const SftProgressCallback& progress = {});

// Mean score of greedy responses to the first `max_samples` examples (used by run_sft; exposed for
// the `hybridflow generate`/eval commands).
double evaluate_exact_match(CausalLM& model, const Tokenizer& tokenizer, const std::vector<std::string>& prompts,
                            const std::vector<std::string>& answers, int64_t max_new_tokens,
                            const std::function<double(const std::string&, const std::string&)>& scorer = {});

// Checkpoint directory name for a step: "<out_dir>/checkpoint-<step>".
std::string checkpoint_dir(const std::string& out_dir, int64_t step);

}  // namespace hybridflow
