#include "hybridflow/tasks/dataset.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "hybridflow/core/error.h"
#include "hybridflow/core/jsonl.h"

namespace hybridflow {

namespace {

std::string string_field(const nlohmann::json& row, const std::string& key, const std::string& where) {
  auto it = row.find(key);
  HF_CHECK(it != row.end(), where, ": missing key \"", key, "\"");
  HF_CHECK(it->is_string(), where, ": \"", key, "\" must be a string, got ", it->type_name());
  return it->get<std::string>();
}

}  // namespace

DatasetSplits make_splits(const Task& task, int64_t train_size, int64_t test_size, uint64_t seed) {
  HF_CHECK(train_size >= 0 && test_size >= 0, "make_splits: sizes must be >= 0, got train ", train_size,
           ", test ", test_size);
  std::mt19937_64 rng(seed);
  DatasetSplits splits;
  // Give up when the draws keep missing: the task's space is smaller than asked for.
  int64_t misses = 0;
  const int64_t max_misses = 1000 + 20 * (train_size + test_size);
  auto miss = [&](const char* why) {
    HF_CHECK(++misses < max_misses, "make_splits: task '", task.name(), "' ", why, " (train ", train_size, " + test ",
             test_size, " asked for); widen the task's digit/length range or ask for fewer");
  };
  // The held-out set first, so that it stays the same when only the train size changes: distinct prompts.
  std::set<std::string> held_out;
  while (static_cast<int64_t>(splits.test.size()) < test_size) {
    Example ex = task.sample(rng);
    if (!held_out.insert(ex.prompt).second) {
      miss("produced too few distinct prompts for the held-out set");
      continue;
    }
    splits.test.push_back(std::move(ex));
  }
  // Training examples are the task's own draws, repeats allowed, never a held-out prompt: the held-out set's
  // distribution. Distinct training prompts would exhaust a small space's small groups and skew the rest
  // (8,000 distinct 1-2 digit sums are 78% two-plus-two digits where the task draws 25%).
  while (static_cast<int64_t>(splits.train.size()) < train_size) {
    Example ex = task.sample(rng);
    if (held_out.count(ex.prompt) > 0) {
      miss("has hardly any prompts outside the held-out set");
      continue;
    }
    splits.train.push_back(std::move(ex));
  }
  return splits;
}

int64_t drop_prompts_of(const std::vector<Example>& held_out, std::vector<Example>* examples) {
  std::set<std::string> prompts;
  for (const auto& ex : held_out) prompts.insert(ex.prompt);
  const auto before = examples->size();
  examples->erase(std::remove_if(examples->begin(), examples->end(),
                                 [&](const Example& ex) { return prompts.count(ex.prompt) > 0; }),
                  examples->end());
  return static_cast<int64_t>(before - examples->size());
}

void write_examples_jsonl(const std::string& path, const std::vector<Example>& examples) {
  std::vector<nlohmann::json> rows;
  rows.reserve(examples.size());
  for (const auto& ex : examples) {
    rows.push_back({{"prompt", ex.prompt}, {"answer", ex.answer}, {"response", ex.answer}});
  }
  write_jsonl(path, rows);
}

std::vector<Example> read_examples_jsonl(const std::string& path) {
  std::vector<Example> out;
  for_each_jsonl_row<nlohmann::json>(path, [&](const nlohmann::json& row, const std::string& where) {
    HF_CHECK(row.is_object(), where, ": expected a JSON object, got ", row.type_name());
    Example ex;
    ex.prompt = string_field(row, "prompt", where);
    ex.answer = string_field(row, row.contains("answer") ? "answer" : "response", where);
    out.push_back(std::move(ex));
  });
  return out;
}

std::vector<PreferencePair> make_preference_pairs(const Task& task, const std::vector<Example>& examples,
                                                  uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<PreferencePair> pairs;
  pairs.reserve(examples.size());
  for (const auto& ex : examples) pairs.push_back({ex.prompt, ex.answer, task.corrupt(ex.answer, rng)});
  return pairs;
}

std::vector<PreferencePair> make_preference_pairs(const Task& task, const std::vector<Example>& examples,
                                                  int64_t per_prompt, uint64_t seed) {
  HF_CHECK(per_prompt >= 1, "data.pairs_per_prompt must be >= 1, got ", per_prompt);
  std::vector<PreferencePair> pairs;
  for (int64_t k = 0; k < per_prompt; ++k) {
    auto more = make_preference_pairs(task, examples, seed + static_cast<uint64_t>(k));
    pairs.insert(pairs.end(), more.begin(), more.end());
  }
  return pairs;
}

void write_preference_jsonl(const std::string& path, const std::vector<PreferencePair>& pairs) {
  std::vector<nlohmann::json> rows;
  rows.reserve(pairs.size());
  for (const auto& p : pairs) rows.push_back({{"prompt", p.prompt}, {"chosen", p.chosen}, {"rejected", p.rejected}});
  write_jsonl(path, rows);
}

}  // namespace hybridflow
