// An interaction: a simulated user or environment that answers the policy between turns. Given the
// conversation so far (OpenAI-style messages) and the row's interaction_kwargs, it returns the next user
// message, whether the episode is over, and optionally a reward for the turn. Forms:
//   command  a program per turn: {"messages": [...], "kwargs": {...}} on stdin, a JSON reply on stdout
//   http     a POST of the same JSON; the reply body is the JSON reply
//   answer_check  built in: compares the last assistant message with kwargs.ground_truth
// The reply JSON: {"message": "...", "done": false, "reward": 0.5} (message and done required).
//
// Config (verl's interaction_config layout):
//   interaction:
//     - name: checker
//       class_name: ...            # verl's Python class; optional, not used
//       config: {type: command, command: [python3, user.py], timeout_s: 10}
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "hybridflow/agent/command_tool.h"
#include "hybridflow/agent/http_tool.h"
#include "hybridflow/agent/tool.h"
#include "hybridflow/core/http_client.h"

namespace hybridflow::agent {

struct InteractionTurn {
  std::string message;            // the next user turn ("" when done without a message)
  bool done = false;              // the episode ends here
  std::optional<double> reward;   // the turn's reward, when the interaction gives one
  std::string error;              // non-empty: the interaction failed (then done is true)
};

class Interaction {
 public:
  explicit Interaction(std::string name) : name_(std::move(name)) {}
  virtual ~Interaction() = default;
  const std::string& name() const { return name_; }
  virtual std::string describe() const = 0;
  // Never throws: a failure ends the episode with `error` set. Thread-safe.
  InteractionTurn respond(const Json& messages, const Json& kwargs) const;

 protected:
  virtual InteractionTurn run(const Json& messages, const Json& kwargs) const = 0;  // may throw

 private:
  std::string name_;
};

// Parses an interaction's reply JSON text; throws naming `who` and what is wrong.
InteractionTurn parse_interaction_reply(const std::string& text, const std::string& who);

class CommandInteraction : public Interaction {
 public:
  // Runs in working_dir (the config file's directory when loaded from one).
  CommandInteraction(std::string name, std::vector<std::string> argv, ProcessBounds bounds, std::string working_dir = "");
  std::string describe() const override;

 protected:
  InteractionTurn run(const Json& messages, const Json& kwargs) const override;

 private:
  std::vector<std::string> argv_;
  ProcessBounds bounds_;
  std::string working_dir_;
};

class HttpInteraction : public Interaction {
 public:
  HttpInteraction(std::string name, const std::string& url, ProcessBounds bounds,
                  const std::vector<std::string>& allowed_hosts, const std::string& where);
  std::string describe() const override;

 protected:
  InteractionTurn run(const Json& messages, const Json& kwargs) const override;

 private:
  HttpEndpoint endpoint_;
};

// Built in: done with reward 1 once the last assistant message contains kwargs.ground_truth (as text);
// else reward 0 and `retry_message`, until max_attempts assistant messages were given (then done).
class AnswerCheckInteraction : public Interaction {
 public:
  AnswerCheckInteraction(std::string name, int max_attempts, std::string correct_message, std::string retry_message);
  std::string describe() const override;

 protected:
  InteractionTurn run(const Json& messages, const Json& kwargs) const override;

 private:
  int max_attempts_;
  std::string correct_message_;
  std::string retry_message_;
};

using Interactions = std::map<std::string, std::shared_ptr<const Interaction>>;

// Loads the interaction config file; errors name the file, the entry and the key.
Interactions load_interaction_config(const std::string& path);
Interactions load_interaction_config_from_string(const std::string& text, const std::string& source_name,
                                                 const std::string& base_dir);

}  // namespace hybridflow::agent
