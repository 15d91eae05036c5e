// Rule-based rewards that users plug in without recompiling: an external command, a local HTTP
// endpoint, or a built-in task's scorer. All score a whole batch per call, so a slow scorer pays its
// start-up cost once per batch, not once per response.
//
// Configured by the `reward` section (schema in kRewardConfigDefaults), or the `cost` section's command /
// http scorer; the trainer reads the section once into a RewardFunctionSpec (its scoring spec,
// trainer/run_spec.h) and make_reward_function builds the scorer from that spec, reading no key itself:
//   type:          task | command | http
//   command:       argv list, e.g. [python3, score.py]; run without a shell (no injection). type=command
//   shell:         a command string run with /bin/sh -c, instead of `command` (user-trusted text)
//   url:           http://HOST:PORT/PATH of the scoring server. type=http
//   allowed_hosts: hosts besides loopback (127.0.0.1, localhost, ::1) that `url` may name
//   timeout_s:     seconds one batch may take before the command is killed / the request fails (a
//                  wall-clock deadline over the whole call, not per read)
//   max_output_bytes: the most a command may print (stdout, and stderr, each) / an HTTP reply body may
//                  hold; more is an error (the command is killed), so a runaway scorer cannot exhaust memory
//   task:          name of the built-in task whose score() to use. type=task
// Wire formats (see docs/rewards.md):
//   command: stdin gets one JSON object per line {"prompt","response","answer","ground_truth","data_source",
//            "extra_info", ...extra};
//            stdout must give one line per request: a JSON number or {"score": x}.
//   http:    POST {"batch": [ {...same objects...} ]} with Content-Type application/json;
//            the reply must be 200 with {"scores": [x, ...]} (one per request).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace hybridflow {

struct RewardRequest {
  std::string prompt;
  std::string response;
  std::string answer;  // ground truth (verl's reward_model.ground_truth), "" when the data has none
  // Extra per-sample fields; merged into the JSON object sent to the scorer.
  nlohmann::json extra = nlohmann::json::object();
  // verl's per-row fields, which verl's compute_score(data_source, solution_str, ground_truth, extra_info)
  // receives: the row's data_source ("" when absent) and extra_info ({} when absent, as verl defaults it).
  // (Initialised here so that the older four-field brace initialisers stay complete.)
  std::string data_source = "";
  nlohmann::json extra_info = nlohmann::json::object();
};

// {"prompt","response","answer","ground_truth" (= answer),"data_source","extra_info"} plus the keys of
// `extra` (which must be an object or null).
nlohmann::json reward_request_to_json(const RewardRequest& request);

class RewardFunction {
 public:
  virtual ~RewardFunction() = default;
  // One score per request, same order. Throws hybridflow::Error when the scorer misbehaves.
  virtual std::vector<double> score(const std::vector<RewardRequest>& batch) = 0;
  // Short description for logs and errors ("command 'python3 score.py'").
  virtual std::string describe() const = 0;
};

// reward.max_output_bytes' default: 16 MiB, far above a score line per response, far below the memory of
// a trainer.
constexpr int64_t kDefaultRewardMaxOutputBytes = int64_t{16} << 20;

// Schema with defaults of the `reward` section, as YAML for Config::load.
extern const std::string kRewardConfigDefaults;
// The keys of an external scorer (command, shell, url, allowed_hosts, timeout_s, max_output_bytes) with
// their defaults, as YAML lines indented under a section: the reward's, and the cost's of the RL trainer.
extern const std::string kScorerKeysYaml;

// A scorer, typed: the keys of a scorer's section (kScorerKeysYaml, and `task` in the reward's). The
// member defaults are the schema's, for a spec built in code; the trainer sets every field.
struct RewardFunctionSpec {
  std::string section = "reward";  // the configuration section it came from: errors name <section>.<key>
  std::string type = "task";       // task | command | http
  std::optional<std::vector<std::string>> command;  // argv, run without a shell (type command) ...
  std::optional<std::string> shell;                 // ... or a command line for /bin/sh -c: exactly one of the two
  std::optional<std::string> url;                   // http://HOST:PORT/PATH (type http)
  std::vector<std::string> allowed_hosts;           // hosts besides loopback that url may name
  double timeout_s = 60.0;
  int64_t max_output_bytes = kDefaultRewardMaxOutputBytes;
  std::optional<std::string> task;  // the built-in task whose rule scores (type task)
};

// Whether `spec` makes a scorer: a known type with what it needs set (exactly one of command and shell, a
// url, a task) and max_output_bytes > 0. Otherwise an Error naming <section>.<key>.
void check_reward_function_spec(const RewardFunctionSpec& spec);

// The scorer `spec` describes (checked as check_reward_function_spec does).
std::unique_ptr<RewardFunction> make_reward_function(const RewardFunctionSpec& spec);

}  // namespace hybridflow
