#include "hybridflow/workers/command_reward.h"

#include <csignal>
#include <cstring>
#include <sstream>

#include "hybridflow/core/error.h"
#include "hybridflow/core/logging.h"
#include "hybridflow/core/subprocess.h"

namespace hybridflow {
namespace {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
  }
  return lines;
}

bool is_blank(const std::string& s) { return s.find_first_not_of(" \t") == std::string::npos; }

std::string clip(const std::string& s, size_t max = 200) {
  return s.size() <= max ? s : s.substr(0, max) + "...";
}

}  // namespace

double parse_score_line(const std::string& line, const std::string& where) {
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error&) {
    HF_FAIL(where, ": expected a JSON number or {\"score\": x}, got '", clip(line), "'");
  }
  if (value.is_object() && value.contains("score")) value = value["score"];
  HF_CHECK(value.is_number(), where, ": expected a JSON number or {\"score\": x}, got '", clip(line), "'");
  return value.get<double>();
}

CommandReward::CommandReward(std::vector<std::string> argv, double timeout_s, int64_t max_output_bytes)
    : argv_(std::move(argv)), timeout_s_(timeout_s), max_output_bytes_(max_output_bytes) {
  HF_CHECK(!argv_.empty() && !argv_[0].empty(), "reward.command: expected a non-empty argv list");
  HF_CHECK(timeout_s_ > 0, "reward.timeout_s: expected > 0, got ", timeout_s_);
  HF_CHECK(max_output_bytes_ > 0, "reward.max_output_bytes: expected > 0, got ", max_output_bytes_);
}

CommandReward CommandReward::shell(const std::string& command_line, double timeout_s, int64_t max_output_bytes) {
  HF_CHECK(!is_blank(command_line), "reward.shell: expected a command line, got an empty string");
  return CommandReward({"/bin/sh", "-c", command_line}, timeout_s, max_output_bytes);
}

std::string CommandReward::describe() const { return describe_command(argv_); }

std::vector<double> CommandReward::score(const std::vector<RewardRequest>& batch) {
  if (batch.empty()) return {};
  std::string input;
  for (const auto& request : batch) input += reward_request_to_json(request).dump() + "\n";
  SubprocessResult run = run_subprocess(argv_, input, timeout_s_, static_cast<size_t>(max_output_bytes_));
  const std::string name = describe();
  // Checked before the stderr is logged: that much of it would flood the log.
  HF_CHECK(!run.output_exceeded, name, " wrote more than ", max_output_bytes_, " bytes to ",
           run.output_exceeded_stream, " on a batch of ", batch.size(),
           " (killed with its process group; reward.max_output_bytes bounds it)");
  for (const auto& line : split_lines(run.err))
    if (!is_blank(line)) log_info("[reward ", name, "] ", line);
  std::string stderr_tail = run.err.empty() ? "" : "; stderr: " + clip(run.err, 500);
  HF_CHECK(!run.timed_out, name, " timed out after ", timeout_s_, " s on a batch of ", batch.size(),
           " (killed; raise reward.timeout_s if the scorer is just slow)", stderr_tail);
  HF_CHECK(!run.signaled, name, " was killed by signal ", run.term_signal, " (", strsignal(run.term_signal), ")",
           stderr_tail);
  HF_CHECK(run.exit_code == 0, name, " exited with status ", run.exit_code, stderr_tail);

  std::vector<std::string> lines = split_lines(run.out);
  while (!lines.empty() && is_blank(lines.back())) lines.pop_back();
  HF_CHECK(lines.size() == batch.size(), name, " printed ", lines.size(), " lines, expected one score per request (",
           batch.size(), ")", stderr_tail);
  std::vector<double> scores;
  scores.reserve(lines.size());
  for (size_t i = 0; i < lines.size(); ++i)
    scores.push_back(parse_score_line(lines[i], name + " stdout line " + std::to_string(i + 1)));
  return scores;
}

}  // namespace hybridflow
