#include "hybridflow/finetune/preference_rows.h"

#include <limits>
#include <nlohmann/json.hpp>

#include "hybridflow/core/error.h"
#include "hybridflow/core/jsonl.h"
#include "hybridflow/tasks/parquet_rows.h"

namespace hybridflow {
namespace {

using Json = nlohmann::ordered_json;

void check_messages(const Json& messages, const std::string& key, const std::string& where) {
  HF_CHECK(messages.is_array() && !messages.empty(), where, ": \"", key,
           "\" must be a string or a non-empty list of chat messages");
  for (const Json& m : messages)
    HF_CHECK(m.is_object() && m.contains("role") && m["role"].is_string() && m.contains("content") &&
                 m["content"].is_string(),
             where, ": every message of \"", key, "\" needs a string \"role\" and \"content\", got ", m.dump());
}

// A response: a string, or chat messages whose last is the assistant's answer (its text is the response).
std::string response_text(const Json& value, const std::string& key, const std::string& where) {
  if (value.is_string()) return value.get<std::string>();
  check_messages(value, key, where);
  const Json& last = value.back();
  HF_CHECK(last["role"] == "assistant", where, ": the last message of \"", key, "\" must be the assistant's, got role \"",
           last["role"].get<std::string>(), "\"");
  return last["content"].get<std::string>();
}

PreferenceRow parse_row(const Json& row, const std::string& where) {
  HF_CHECK(row.is_object(), where, ": expected a JSON object {\"prompt\", \"chosen\", \"rejected\"}, got ",
           row.type_name());
  for (const char* key : {"chosen", "rejected"})
    HF_CHECK(row.contains(key), where, ": missing key \"", key, "\"");
  PreferenceRow out;
  out.prompt.where = where;
  const Json &chosen = row["chosen"], &rejected = row["rejected"];
  if (row.contains("prompt") && !row["prompt"].is_null()) {  // a parquet column may hold nulls
    const Json& prompt = row["prompt"];
    if (prompt.is_string()) {
      out.prompt.prompt = prompt.get<std::string>();
    } else {
      check_messages(prompt, "prompt", where);
      out.prompt.messages = prompt;
    }
    // An explicit prompt: each side is its answer alone.
    for (const auto* side : {&chosen, &rejected})
      HF_CHECK(side->is_string() || (side->is_array() && side->size() == 1), where, ": with a \"prompt\", \"",
               side == &chosen ? "chosen" : "rejected", "\" must be a string or one assistant message");
  } else {
    // An implicit prompt: the messages before each side's last, the same on both sides.
    HF_CHECK(chosen.is_array() && rejected.is_array() && chosen.size() >= 2 && rejected.size() >= 2, where,
             ": without a \"prompt\" key, \"chosen\" and \"rejected\" must be conversations (the prompt's messages, "
             "then the answer)");
    check_messages(chosen, "chosen", where);
    check_messages(rejected, "rejected", where);
    Json prompt = Json::array();
    for (size_t i = 0; i + 1 < chosen.size(); ++i) prompt.push_back(chosen[i]);
    Json other = Json::array();
    for (size_t i = 0; i + 1 < rejected.size(); ++i) other.push_back(rejected[i]);
    HF_CHECK(prompt == other, where, ": \"chosen\" and \"rejected\" must share every message before their last");
    out.prompt.messages = prompt;
  }
  out.chosen = response_text(chosen, "chosen", where);
  out.rejected = response_text(rejected, "rejected", where);
  return out;
}

}  // namespace

std::vector<PreferenceRow> read_preference_rows(const std::string& path) {
  std::vector<PreferenceRow> out;
  if (path.ends_with(".parquet")) {
    const auto table = read_parquet_rows(path);
    for (size_t i = 0; i < table.size(); ++i) out.push_back(parse_row(table[i], path + ": row " + std::to_string(i)));
  } else {
    HF_CHECK(path.ends_with(".jsonl") || path.ends_with(".json"), path, ": unknown preference file type; expected ",
             ".jsonl / .json (one pair a line) or .parquet");
    for_each_jsonl_row<Json>(path, [&](const Json& row, const std::string& where) { out.push_back(parse_row(row, where)); });
  }
  HF_CHECK(!out.empty(), path, ": no preference pairs");
  return out;
}

PromptOptions preference_prompt_options(bool apply_chat_template, bool add_bos) {
  PromptOptions o;
  o.max_prompt_length = std::numeric_limits<int64_t>::max();
  o.apply_chat_template = apply_chat_template;
  o.add_bos = add_bos;
  return o;
}

EncodedPreference encode_preference_row(const PreferenceRow& row, const Tokenizer& tokenizer, PromptEncoder& prompts) {
  EncodedPreference out;
  try {
    std::string text;
    out.prompt = prompts.encode_row(row.prompt, &text);
    out.chosen = tokenizer.encode(row.chosen);
    out.rejected = tokenizer.encode(row.rejected);
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.find(row.prompt.where) != std::string::npos) throw;
    HF_FAIL(row.prompt.where, ": ", what);
  }
  out.chosen.push_back(tokenizer.eos_id());
  out.rejected.push_back(tokenizer.eos_id());
  return out;
}

}  // namespace hybridflow
