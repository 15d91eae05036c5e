// Task data sets as JSONL files: SFT / RL examples {"prompt", "answer", "response"} and reward-model
// preference pairs {"prompt", "chosen", "rejected"}.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hybridflow/tasks/task.h"

namespace hybridflow {

struct DatasetSplits {
  std::vector<Example> train;
  std::vector<Example> test;
};

// Samples with a fixed seed: first test_size distinct prompts, then train_size draws of the task (repeats
// allowed, so training follows the task's distribution as the held-out set does) that are not held-out
// prompts. Throws when the task cannot produce that many distinct held-out prompts or hardly any outside
// them (naming the task and the counts).
DatasetSplits make_splits(const Task& task, int64_t train_size, int64_t test_size, uint64_t seed);

// Removes from *examples every example whose prompt is one of `held_out`'s, keeping the order: a split
// generated here must not train on a held-out set read from elsewhere. Returns how many were removed.
int64_t drop_prompts_of(const std::vector<Example>& held_out, std::vector<Example>* examples);

// One line per example: {"prompt", "answer", "response"} with response = answer (the SFT target).
void write_examples_jsonl(const std::string& path, const std::vector<Example>& examples);
// Reads "prompt" and "answer" (or "response" when there is no "answer"); errors name "<path>:<line>".
std::vector<Example> read_examples_jsonl(const std::string& path);

struct PreferencePair {
  std::string prompt;
  std::string chosen;
  std::string rejected;
};

// chosen = the answer, rejected = task.corrupt(answer); deterministic for a seed.
std::vector<PreferencePair> make_preference_pairs(const Task& task, const std::vector<Example>& examples,
                                                  uint64_t seed);
// `per_prompt` rounds of make_preference_pairs (seeds seed, seed + 1, ...): several wrong answers for each
// right one, round after round.
std::vector<PreferencePair> make_preference_pairs(const Task& task, const std::vector<Example>& examples,
                                                  int64_t per_prompt, uint64_t seed);
void write_preference_jsonl(const std::string& path, const std::vector<PreferencePair>& pairs);

}  // namespace hybridflow
