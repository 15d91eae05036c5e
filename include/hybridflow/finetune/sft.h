// Supervised fine-tuning on prompt/response pairs: loss on response tokens + eos only, padded
// batches, warm-up + decay schedule, periodic held-out exact-match evaluation by greedy decoding,
// and periodic checkpoints to resume from (finetune/fine_tune_checkpoint.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hybridflow/finetune/fine_tune_checkpoint.h"
#include "hybridflow/finetune/fine_tune_options.h"
#include "hybridflow/engine/prompt_encoder.h"
#include "hybridflow/model/tokenizer.h"
#include "hybridflow/model/transformer.h"

namespace hybridflow {

struct SftOptions : FineTuneOptions {
  // train_file / eval_file rows: {"prompt", "response"} (or "answer"), or verl's rows (parquet or JSONL:
  // chat messages, the target in reward_model.ground_truth; docs/data.md); out_dir also receives the
  // checkpoints (out_dir/checkpoint-STEP) and the metrics go to out_dir/sft_metrics.jsonl.
  // Prompts are encoded as the RL trainer encodes them (engine/prompt_encoder.h): chat messages, and plain
  // strings when apply_chat_template, through model_dir's chat template with the generation prompt.
  std::string model_dir;
  bool apply_chat_template = false;
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

struct SftResult : FineTuneRunInfo {
  std::vector<SftMetrics> history;  // one entry per step run (after resumed_step)
  int64_t steps = 0;
  double final_eval_accuracy = -1;
};

struct SftExample {
  std::vector<int64_t> prompt;    // as RL encodes it: through the chat template, or bos + the plain string
  std::vector<int64_t> response;  // the target + eos
  std::string answer;
  std::string prompt_text;        // the plain prompt, or the chat as the template rendered it
};

// Rows of any format read_prompt_rows reads (tasks/prompt_rows.h). A row without a target (response,
// answer or reward_model.ground_truth) is an error naming it.
std::vector<SftExample> read_sft_examples(const std::string& path, const Tokenizer& tokenizer, PromptEncoder& prompts);

using SftProgressCallback = std::function<void(const SftMetrics&)>;

SftResult run_sft(const SftOptions& options, CausalLM& model, const Tokenizer& tokenizer,
                  const SftProgressCallback& progress = {});

// Mean score of greedy responses to encoded prompts against their answers (used by run_sft).
double evaluate_exact_match(CausalLM& model, const Tokenizer& tokenizer,
                            const std::vector<std::vector<int64_t>>& prompts, const std::vector<std::string>& answers,
                            int64_t max_new_tokens,
                            const std::function<double(const std::string&, const std::string&)>& scorer = {});

}  // namespace hybridflow
