// Prompts as the actor sees them (and SFT trains on them): data rows (tasks/prompt_rows.h) rendered,
// encoded and held to data.max_prompt_length once, when the data is loaded, as verl's RLHFDataset does. Chat messages go
// through the model's chat template with the generation prompt and are encoded without adding special
// tokens (the template writes them: verl's apply_chat_template(tokenize=False), then
// tokenizer(..., add_special_tokens=False)); plain strings are encoded as they are, with data.add_bos,
// unless data.apply_chat_template wraps them as one user message.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hybridflow/model/tokenizer.h"
#include "hybridflow/tasks/prompt_rows.h"
#include "hybridflow/text/tokenizer_config.h"

namespace hybridflow {

class Config;

// data.truncation, verl's modes for a prompt longer than data.max_prompt_length tokens.
enum class Truncation { kError, kLeft, kRight, kMiddle };
Truncation parse_truncation(const std::string& value);  // unknown -> Error naming data.truncation

// `ids` cut to `max_length` tokens: left keeps the end, right keeps the start, middle keeps the first
// max_length / 2 and the last max_length - max_length / 2 (verl's postprocess_data). kError is not a cut:
// it returns the ids unchanged.
std::vector<int64_t> truncate_prompt(const std::vector<int64_t>& ids, int64_t max_length, Truncation mode);

struct PromptOptions {
  int64_t max_prompt_length = 512;
  Truncation truncation = Truncation::kError;
  bool filter_overlong_prompts = false;  // drop overlong prompts at load instead of truncating or failing
  bool apply_chat_template = false;      // plain-string prompts as one user message through the template
  bool add_bos = true;                   // plain strings encoded without a template
  // data.apply_chat_template_kwargs: further variables of the chat template, as verl hands them to
  // apply_chat_template (Qwen3's enable_thinking: false, ...). An object.
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  // actor_rollout_ref.model.custom_chat_template: a Jinja template used instead of the model directory's (as
  // verl sets tokenizer.chat_template; with or without tools); "" = the model's.
  std::string custom_chat_template;
  // From the `data` section of the trainer's config; bad values are errors naming the key.
  static PromptOptions from_config(const Config& config);
};

struct EncodedPrompt {
  std::vector<int64_t> ids;  // what generation starts from: at most max_prompt_length tokens
  std::string text;          // the plain prompt, or the chat rendered by the template (before any cut)
  std::string answer;        // the ground truth
  std::string data_source;
  nlohmann::ordered_json extra_info = nlohmann::ordered_json::object();
  // What a multi-turn rollout starts from instead of `ids`: the row's chat messages (a plain prompt as its
  // string) and its agent fields (tasks/prompt_rows.h).
  nlohmann::ordered_json messages;
  std::string agent_name;
  nlohmann::ordered_json tools_kwargs = nlohmann::ordered_json::object();
  nlohmann::ordered_json interaction_kwargs = nlohmann::ordered_json::object();
};

class PromptEncoder {
 public:
  // `model_dir` ("" for a preset) is where a chat template comes from: <model_dir>/tokenizer_config.json
  // (or chat_template.jinja beside it), read the first time a row needs one.
  PromptEncoder(const Tokenizer& tokenizer, std::string model_dir, PromptOptions options);

  // Every row of `rows` (read from `file`, which names them in errors and logs). Overlong prompts are
  // dropped with filter_overlong_prompts (logged with their count; all of them dropped is an error),
  // else cut as truncation says, else an error naming the row and both lengths.
  std::vector<EncodedPrompt> encode(const std::vector<PromptRow>& rows, const std::string& file);

  // One row's token ids before any length limit.
  std::vector<int64_t> encode_row(const PromptRow& row, std::string* text);

 private:
  const text::TokenizerConfig& chat_config(const PromptRow& row);

  const Tokenizer& tokenizer_;
  std::string model_dir_;
  PromptOptions options_;
  std::optional<text::TokenizerConfig> chat_config_;
};

}  // namespace hybridflow
