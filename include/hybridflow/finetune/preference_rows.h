// Preference pairs as `hybridflow dpo` and `hybridflow rm` read them, in TRL's dataset formats (JSONL, one pair a line, or parquet
// with those columns):
//   standard:                     {"prompt": "2+3=", "chosen": "5", "rejected": "6"}
//   conversational, explicit:     {"prompt": [{"role": "user", "content": "..."}],
//                                  "chosen": [{"role": "assistant", "content": "5"}], "rejected": [...]}
//   conversational, implicit:     {"chosen": [user..., {"role": "assistant", ...}], "rejected": [user..., ...]}
// (the prompt is every message before the last, which both sides must share). A conversational prompt goes
// through the model's chat template with the generation prompt, as the RL trainer's chat rows do; a response is
// the text of the last (assistant) message.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hybridflow/engine/prompt_encoder.h"
#include "hybridflow/model/tokenizer.h"
#include "hybridflow/tasks/prompt_rows.h"

namespace hybridflow {

struct PreferenceRow {
  PromptRow prompt;  // a plain string or chat messages; where = "<file>:<line>"
  std::string chosen;
  std::string rejected;
};

// Every pair of `path` (.jsonl / .json: every non-blank line; .parquet: every row); errors name "<path>:<line>"
// (or "<path>: row N") and what was expected.
std::vector<PreferenceRow> read_preference_rows(const std::string& path);

// How dpo and rm encode prompts: as the RL trainer does, without its prompt-length limit (a pair is trained on
// whole; the configs have no data.max_prompt_length).
PromptOptions preference_prompt_options(bool apply_chat_template, bool add_bos);

// A pair as token ids: the prompt as the RL trainer's actor sees it (PromptEncoder: a chat through the template
// with the generation prompt; a string with data.add_bos, or as a user message with data.apply_chat_template),
// each response's text encoded and followed by eos. Errors name the row's file and line.
struct EncodedPreference {
  std::vector<int64_t> prompt, chosen, rejected;
};
EncodedPreference encode_preference_row(const PreferenceRow& row, const Tokenizer& tokenizer, PromptEncoder& prompts);

}  // namespace hybridflow
