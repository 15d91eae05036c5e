// RL prompt data in verl's format and in hybridflow's older JSONL rows (docs/data.md).
//
// A verl row: `prompt` is a list of {role, content} messages (or a plain string), `data_source` a string,
// `reward_model` {style, ground_truth}, `extra_info` anything. Such rows come as parquet (verl's format,
// read with Arrow) or as JSON lines of the same shape. An older row is {"prompt": "...", "answer" or
// "response": "..."}. Other columns (verl's `ability`, pandas' index) are ignored.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hybridflow/tasks/task.h"

namespace hybridflow {

struct PromptRow {
  std::string prompt;               // a plain-string prompt; "" when `messages` holds the prompt
  nlohmann::ordered_json messages;  // a chat prompt [{role, content}, ...]; null for a plain string
  std::string answer;               // reward_model.ground_truth, else "answer" / "response"; "" if none
  std::string data_source;          // "" when absent
  // As stored; {} when absent or null, as verl's reward managers default it.
  nlohmann::ordered_json extra_info = nlohmann::ordered_json::object();
  // verl's per-row agent fields, each a top-level column or inside extra_info (where verl's preprocessing
  // scripts put them): which agent runs the row ("" or "single_turn_agent": one plain turn) and the row's
  // kwargs for its tools ({tool name: {...}}) and its interaction ({"name": ..., ...}); {} when absent.
  std::string agent_name;
  nlohmann::ordered_json tools_kwargs = nlohmann::ordered_json::object();
  nlohmann::ordered_json interaction_kwargs = nlohmann::ordered_json::object();
  std::string where;                // "<file>: row N" (parquet) or "<file>:LINE" (JSONL), for messages

  bool is_chat() const { return !messages.is_null(); }
};

// Which columns hold a row's prompt and its data source: verl's data.prompt_key and data.reward_fn_key.
struct PromptColumns {
  std::string prompt = "prompt";
  std::string data_source = "data_source";
};

// One row of either shape. `where` prefixes every error, `noun` names a field in it ("column" for parquet,
// "key" for JSON): "train.parquet: row 12: column 'prompt' must be a list of {role, content} messages".
PromptRow parse_prompt_row(const nlohmann::ordered_json& row, const std::string& where, const std::string& noun,
                           const PromptColumns& columns = {});

// By extension: .parquet, or .jsonl / .json (one JSON object per line). Another extension is an error
// naming the file. Rows of parquet files are numbered from 0 (as pandas and pyarrow number them), JSONL
// rows by line from 1.
std::vector<PromptRow> read_prompt_rows(const std::string& path, const PromptColumns& columns = {});
// The rows of several files, one after another (verl's data.train_files: datasets concatenated in order).
std::vector<PromptRow> read_prompt_rows(const std::vector<std::string>& paths, const PromptColumns& columns = {});

// A built-in task's example as a verl row: the question as one user message, data_source = the task's name,
// reward_model {style: rule, ground_truth: answer}, extra_info {split, index}.
nlohmann::ordered_json verl_row(const Task& task, const Example& example, const std::string& split, int64_t index);

// The user message verl_row asks: the task's prompt as a question ("What is 12+34? ...").
std::string task_question(const Task& task, const Example& example);

}  // namespace hybridflow
