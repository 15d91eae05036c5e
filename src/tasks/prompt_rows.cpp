#include "hybridflow/tasks/prompt_rows.h"

#include <iterator>

#include "hybridflow/core/error.h"
#include "hybridflow/core/jsonl.h"
#include "hybridflow/tasks/parquet_rows.h"

namespace hybridflow {

namespace {

using Json = nlohmann::ordered_json;

// The row's text-valued field, "" when absent or null.
std::string optional_string(const Json& row, const std::string& key, const std::string& where, const std::string& noun) {
  const auto it = row.find(key);
  if (it == row.end() || it->is_null()) return "";
  HF_CHECK(it->is_string(), where, ": ", noun, " '", key, "' must be a string, got ", it->type_name());
  return it->get<std::string>();
}

// `field` names the prompt's column as errors say it: "column 'prompt'".
Json chat_messages(const Json& prompt, const std::string& where, const std::string& field) {
  const std::string expected = field + " must be a string or a non-empty list of {role, content} messages";
  HF_CHECK(!prompt.empty(), where, ": ", expected, ", got an empty list");
  Json messages = Json::array();
  for (size_t i = 0; i < prompt.size(); ++i) {
    const Json& m = prompt[i];
    HF_CHECK(m.is_object(), where, ": ", expected, "; message ", i, " is ", m.type_name());
    for (const char* key : {"role", "content"}) {
      const auto it = m.find(key);
      HF_CHECK(it != m.end() && it->is_string(), where, ": ", expected, "; message ", i, " has ",
               it == m.end() ? "no '" + std::string(key) + "'" : "'" + std::string(key) + "' of type " + it->type_name(),
               " (expected a string)");
    }
    messages.push_back(m);
  }
  return messages;
}

// reward_model.ground_truth: verl keeps the answer a rule scorer compares with here. A number is taken as
// its text, so a ground truth written as 46 by pandas still reads as "46".
std::string ground_truth(const Json& reward_model, const std::string& where, const std::string& noun) {
  HF_CHECK(reward_model.is_object(), where, ": ", noun, " 'reward_model' must be {style, ground_truth}, got ",
           reward_model.type_name());
  const auto it = reward_model.find("ground_truth");
  if (it == reward_model.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  HF_CHECK(it->is_number(), where, ": ", noun, " 'reward_model.ground_truth' must be a string (or a number), got ",
           it->type_name());
  return it->dump();
}

std::vector<PromptRow> read_jsonl_rows(const std::string& path, const PromptColumns& columns) {
  std::vector<PromptRow> rows;
  for_each_jsonl_row<Json>(path, [&](const Json& row, const std::string& where) {
    rows.push_back(parse_prompt_row(row, where, "key", columns));
  });
  return rows;
}

}  // namespace

PromptRow parse_prompt_row(const nlohmann::ordered_json& row, const std::string& where, const std::string& noun,
                           const PromptColumns& columns) {
  const std::string& key = columns.prompt;
  // Another column than verl's default is named with the setting that chose it.
  const std::string chosen = key == "prompt" ? "" : " (data.prompt_key)";
  HF_CHECK(row.is_object(), where, ": expected an object with a '", key, "'", chosen, ", got ", row.type_name());
  PromptRow out;
  out.where = where;
  const auto prompt = row.find(key);
  HF_CHECK(prompt != row.end() && !prompt->is_null(), where, ": missing ", noun, " '", key, "'", chosen,
           " (a string or a list of {role, content} messages)");
  if (prompt->is_string()) {
    out.prompt = prompt->get<std::string>();
  } else {
    HF_CHECK(prompt->is_array(), where, ": ", noun, " '", key, "'", chosen,
             " must be a string or a list of {role, content} messages, got ", prompt->type_name());
    out.messages = chat_messages(*prompt, where, noun + " '" + key + "'" + chosen);
  }
  const auto reward_model = row.find("reward_model");
  if (reward_model != row.end() && !reward_model->is_null()) {
    out.answer = ground_truth(*reward_model, where, noun);
  } else {
    out.answer = optional_string(row, row.contains("answer") ? "answer" : "response", where, noun);
  }
  out.data_source = optional_string(row, columns.data_source, where, noun);
  if (const auto extra = row.find("extra_info"); extra != row.end() && !extra->is_null()) out.extra_info = *extra;
  // The agent fields: a top-level column wins over extra_info's entry; null is absent (a parquet struct
  // column gives null to the rows that lack a key).
  auto agent_field = [&](const char* key) -> std::pair<const Json*, std::string> {
    if (const auto it = row.find(key); it != row.end() && !it->is_null()) return {&*it, std::string(noun) + " '" + key + "'"};
    if (out.extra_info.is_object())
      if (const auto it = out.extra_info.find(key); it != out.extra_info.end() && !it->is_null())
        return {&*it, std::string(noun) + " 'extra_info." + key + "'"};
    return {nullptr, ""};
  };
  if (const auto [name, what] = agent_field("agent_name"); name) {
    HF_CHECK(name->is_string(), where, ": ", what, " must be a string (the agent that runs the row), got ",
             name->type_name());
    out.agent_name = name->get<std::string>();
  }
  for (const auto& [key, target] : {std::pair{"tools_kwargs", &out.tools_kwargs},
                                    std::pair{"interaction_kwargs", &out.interaction_kwargs}}) {
    const auto [value, what] = agent_field(key);
    if (!value) continue;
    HF_CHECK(value->is_object(), where, ": ", what, " must be an object, got ", value->type_name());
    *target = *value;
  }
  return out;
}

std::vector<PromptRow> read_prompt_rows(const std::string& path, const PromptColumns& columns) {
  if (path.ends_with(".parquet")) {
    const auto table = read_parquet_rows(path);
    std::vector<PromptRow> rows;
    rows.reserve(table.size());
    for (size_t i = 0; i < table.size(); ++i)
      rows.push_back(parse_prompt_row(table[i], path + ": row " + std::to_string(i), "column", columns));
    return rows;
  }
  if (path.ends_with(".jsonl") || path.ends_with(".json")) return read_jsonl_rows(path, columns);
  HF_FAIL(path, ": unknown data file type; expected .parquet (verl's format) or .jsonl / .json (one JSON object ",
          "per line)");
}

std::vector<PromptRow> read_prompt_rows(const std::vector<std::string>& paths, const PromptColumns& columns) {
  std::vector<PromptRow> rows;
  for (const auto& path : paths) {
    auto more = read_prompt_rows(path, columns);
    rows.insert(rows.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
  }
  return rows;
}

}  // namespace hybridflow
