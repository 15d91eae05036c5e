// Preference pairs as `hybridflow dpo` reads them, in TRL's dataset formats (JSONL, one pair a line, or parquet
// with those columns):
//   standard:                     {"prompt": "2+3=", "chosen": "5", "rejected": "6"}
//   conversational, explicit:     {"prompt": [{"role": "user", "content": "..."}],
//                                  "chosen": [{"role": "assistant", "content": "5"}], "rejected": [...]}
//   conversational, implicit:     {"chosen": [user..., {"role": "assistant", ...}], "rejected": [user..., ...]}
// (the prompt is every message before the last, which both sides must share). A conversational prompt goes
// through the model's chat template with the generation prompt, as the RL trainer's chat rows do; a response is
// the text of the last (assistant) message.
#pragma once

#include <string>
#include <vector>

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

}  // namespace hybridflow
