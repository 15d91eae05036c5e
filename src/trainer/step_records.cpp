#include "hybridflow/trainer/step_records.h"

#include <chrono>
#include <cmath>

#include "hybridflow/core/jsonl.h"
#include "hybridflow/report/tensorboard_export.h"

namespace hybridflow {
namespace {

nlohmann::json finite_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

double seconds_between(CallSpan::Clock::time_point from, CallSpan::Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// A multi-turn sample's conversation and counts beside its record; nothing for a single turn.
void add_episode_keys(const nlohmann::json& episode, nlohmann::json& record) {
  if (!episode.is_object()) return;
  for (const char* key : {"messages", "turns", "tool_calls", "tool_errors", "sampled_tokens", "appended_tokens", "stop"})
    if (episode.contains(key)) record[key] = episode.at(key);
}

}  // namespace

bool logs_samples_at(int64_t step, int64_t freq) { return freq > 0 && step > 0 && step % freq == 0; }

std::vector<int64_t> sample_rows(int64_t rows, int64_t count) {
  std::vector<int64_t> out;
  if (rows <= 0 || count <= 0) return out;
  if (count >= rows) count = rows;
  for (int64_t i = 0; i < count; ++i) out.push_back(i * rows / count);
  return out;
}

nlohmann::json sample_record(int64_t step, const RolloutSample& s) {
  nlohmann::json record = {{"step", step},
          {"prompt", s.prompt},
          {"response", s.response},
          {"score", finite_or_null(s.score)},
          {"reward", finite_or_null(s.reward)},
          {"advantage", finite_or_null(s.advantage)},
          {"response_length", s.response_length}};
  add_episode_keys(s.episode, record);
  return record;
}

nlohmann::json generation_record(int64_t step, const RolloutSample& s, bool trained) {
  nlohmann::json record = {{"input", s.prompt},           {"output", s.response},
                           {"gts", s.answer},             {"score", finite_or_null(s.score)},
                           {"step", step},                {"data_source", s.data_source},
                           {"response_length", s.response_length}};
  if (trained) {
    record["reward"] = finite_or_null(s.reward);
    record["advantage"] = finite_or_null(s.advantage);
  }
  add_episode_keys(s.episode, record);
  return record;
}

void write_generations(const std::string& dir, int64_t step, const std::vector<nlohmann::json>& rows) {
  make_dirs(dir);
  write_jsonl(dir + "/" + std::to_string(step) + ".jsonl", rows);
}

// A conversation as the report shows it: each message under its role, tool calls as the JSON they carry.
static std::string sample_conversation_text(const nlohmann::json& messages) {
  std::string out;
  for (const auto& m : messages) {
    out += "[" + m.value("role", std::string("?")) + "] ";
    const auto content = m.find("content");
    if (content != m.end()) out += content->is_string() ? content->get<std::string>() : content->dump();
    if (m.contains("tool_calls")) out += " " + m.at("tool_calls").dump();
    out += "\n";
  }
  return out;
}

std::string rollout_samples_markdown(const std::vector<RolloutSample>& samples) {
  std::vector<report::Sample> rows;
  for (const auto& s : samples) {
    report::Sample r;
    r.prompt = s.prompt;
    r.response = s.episode.is_object() && s.episode.contains("messages") ? sample_conversation_text(s.episode.at("messages"))
                                                                         : s.response;
    if (std::isfinite(s.reward)) r.reward = s.reward;
    if (std::isfinite(s.advantage)) r.advantage = s.advantage;
    rows.push_back(std::move(r));
  }
  std::vector<const report::Sample*> pointers;
  for (const auto& r : rows) pointers.push_back(&r);
  return report::samples_markdown(pointers);
}

std::vector<nlohmann::json> timeline_records(int64_t step, const std::vector<CallSpan>& spans,
                                             CallSpan::Clock::time_point step_start, double step_start_unix_s) {
  std::vector<nlohmann::json> out;
  for (const auto& span : spans) {
    const double start = seconds_between(step_start, span.start);
    const double end = std::max(start, seconds_between(step_start, span.end));
    out.push_back({{"step", step},
                   {"pool", span.pool},
                   {"call", span.role + "." + span.method},
                   {"start_s", start},
                   {"end_s", end},
                   {"step_start_unix_s", step_start_unix_s}});
  }
  return out;
}

}  // namespace hybridflow
