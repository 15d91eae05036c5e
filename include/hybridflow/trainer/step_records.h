// What an RL step writes beside its metrics for watching a run: a few rollout samples
// (<run_dir>/samples.jsonl, trainer.log_samples_freq / log_samples_count) and the step's timeline of
// calls per worker pool (<run_dir>/timeline.jsonl). The formats are the ones the HTML report reads
// (report/run_data.h; docs/report.md).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hybridflow/runtime/call_timeline.h"

namespace hybridflow {

struct RolloutSample {
  std::string prompt, response;
  double score = 0;      // the sequence score (rule + reward model + overlong penalty)
  double reward = 0;     // the sum of the token-level rewards (score minus any in-reward KL penalty)
  double advantage = 0;  // the mean advantage over the response tokens
  int64_t response_length = 0;
  // A multi-turn sample's episode (workers/agent_rollout.h's agent_episode_record): null for a single turn.
  nlohmann::json episode;
  std::string answer, data_source;  // the prompt row's ground truth and data source (its scorer's inputs)
};

// Whether step `step` (1-based, as in metrics.jsonl) logs samples: every `freq`-th step; freq <= 0 never.
bool logs_samples_at(int64_t step, int64_t freq);

// `count` row indices spread evenly over a batch of `rows` rows (0, rows/count, ...), so that with
// responses grouped per prompt they come from different prompts while count <= prompts. All rows
// when count >= rows.
std::vector<int64_t> sample_rows(int64_t rows, int64_t count);

// {"step", "prompt", "response", "score", "reward", "advantage", "response_length"}; a number that is
// not finite is written as null (JSON has no NaN), as metrics.jsonl does.
// A multi-turn sample adds "messages" (the whole conversation, each turn with its role), "turns", "tool_calls",
// "tool_errors", "sampled_tokens", "appended_tokens" and "stop" from its episode.
nlohmann::json sample_record(int64_t step, const RolloutSample& sample);

// One line of verl's generation dumps (trainer.rollout_data_dir, trainer.validation_data_dir): verl's
// {"input", "output", "gts", "score", "step"}, then "data_source" and "response_length"; a trained row
// (`trained`) adds "reward" and "advantage" (null when not finite), and a multi-turn one the episode's keys
// as sample_record does.
nlohmann::json generation_record(int64_t step, const RolloutSample& sample, bool trained);

// Writes `rows` as <dir>/<step>.jsonl (the directory made if needed), atomically: a crash leaves the file of
// the step before or this one whole, and a resumed run that repeats a step replaces its file.
void write_generations(const std::string& dir, int64_t step, const std::vector<nlohmann::json>& rows);

// The samples of one step as markdown for TensorBoard's Text tab (the report's own formatting: model
// output in indented code blocks, shown verbatim).
std::string rollout_samples_markdown(const std::vector<RolloutSample>& samples);

// One row per span: {"step", "pool", "call": "<role>.<method>", "start_s", "end_s", "step_start_unix_s"}.
// start_s and end_s are seconds from `step_start` (when the step began); step_start_unix_s places the
// step on the wall clock, so that steps of a resumed run still line up in the report.
std::vector<nlohmann::json> timeline_records(int64_t step, const std::vector<CallSpan>& spans,
                                             CallSpan::Clock::time_point step_start, double step_start_unix_s);

}  // namespace hybridflow
