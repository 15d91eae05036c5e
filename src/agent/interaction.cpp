#include "hybridflow/agent/interaction.h"

#include <filesystem>

#include "config_entry.h"
#include "hybridflow/agent/http_tool.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/subprocess.h"

namespace hybridflow::agent {
namespace interaction_detail {

std::string clip_reply(const std::string& s, size_t max = 300) { return s.size() <= max ? s : s.substr(0, max) + "..."; }

Json interaction_request(const Json& messages, const Json& kwargs) {
  return Json{{"messages", messages}, {"kwargs", kwargs.is_null() ? Json::object() : kwargs}};
}

std::string content_of(const Json& message) {
  if (!message.is_object() || !message.contains("content")) return "";
  const Json& content = message["content"];
  if (content.is_string()) return content.get<std::string>();
  std::string text;  // a list of parts: the text ones
  if (content.is_array())
    for (const auto& part : content)
      if (part.is_object() && part.value("type", "") == "text" && part.contains("text") && part["text"].is_string())
        text += part["text"].get<std::string>();
  return text;
}

}  // namespace interaction_detail

using namespace interaction_detail;

InteractionTurn Interaction::respond(const Json& messages, const Json& kwargs) const {
  try {
    return run(messages, kwargs);
  } catch (const std::exception& e) {
    InteractionTurn failed;
    failed.done = true;
    failed.error = "interaction '" + name_ + "' (" + describe() + "): " + e.what();
    return failed;
  }
}

InteractionTurn parse_interaction_reply(const std::string& text, const std::string& who) {
  Json reply;
  try {
    reply = Json::parse(text);
  } catch (const Json::parse_error&) {
    HF_FAIL(who, ": expected a JSON reply {\"message\": ..., \"done\": ..., \"reward\": ...}, got '", clip_reply(text), "'");
  }
  HF_CHECK(reply.is_object(), who, ": expected a JSON object, got '", clip_reply(text), "'");
  HF_CHECK(reply.contains("message") && reply["message"].is_string(), who,
           ": the reply needs \"message\" (a string), got '", clip_reply(text), "'");
  HF_CHECK(reply.contains("done") && reply["done"].is_boolean(), who, ": the reply needs \"done\" (true or false), got '",
           clip_reply(text), "'");
  InteractionTurn turn;
  turn.message = reply["message"].get<std::string>();
  turn.done = reply["done"].get<bool>();
  if (reply.contains("reward") && !reply["reward"].is_null()) {
    HF_CHECK(reply["reward"].is_number(), who, ": \"reward\" must be a number or null, got ", reply["reward"].dump());
    turn.reward = reply["reward"].get<double>();
  }
  return turn;
}

CommandInteraction::CommandInteraction(std::string name, std::vector<std::string> argv, ProcessBounds bounds,
                                       std::string working_dir)
    : Interaction(std::move(name)), argv_(std::move(argv)), bounds_(bounds), working_dir_(std::move(working_dir)) {
  HF_CHECK(!argv_.empty() && !argv_[0].empty(), "interaction '", this->name(), "': empty command");
}

std::string CommandInteraction::describe() const { return describe_command(argv_); }

InteractionTurn CommandInteraction::run(const Json& messages, const Json& kwargs) const {
  SubprocessOptions options;
  options.working_dir = working_dir_;
  SubprocessResult run = run_subprocess(argv_, interaction_request(messages, kwargs).dump() + "\n", bounds_.timeout_s,
                                        static_cast<size_t>(bounds_.max_output_bytes), options);
  HF_CHECK(!run.output_exceeded, "wrote more than ", bounds_.max_output_bytes, " bytes to ", run.output_exceeded_stream,
           " (max_output_bytes)");
  HF_CHECK(!run.timed_out, "no reply within ", bounds_.timeout_s, " s (timeout_s)");
  std::string stderr_tail = run.err.empty() ? "" : "; stderr: " + clip_reply(run.err, 500);
  HF_CHECK(!run.signaled, "killed by signal ", run.term_signal, stderr_tail);
  HF_CHECK(run.exit_code == 0, "exited with status ", run.exit_code, stderr_tail);
  return parse_interaction_reply(run.out, "its stdout");
}

HttpInteraction::HttpInteraction(std::string name, const std::string& url, ProcessBounds bounds,
                                 const std::vector<std::string>& allowed_hosts, const std::string& where)
    : Interaction(std::move(name)), endpoint_(url, bounds, allowed_hosts, where) {}

std::string HttpInteraction::describe() const { return endpoint_.describe(); }

InteractionTurn HttpInteraction::run(const Json& messages, const Json& kwargs) const {
  HttpResponse reply =
      endpoint_.post_json(interaction_request(messages, kwargs).dump(), "interaction '" + name() + "'");
  HF_CHECK(reply.status == 200, "answered HTTP ", reply.status, ": ", clip_reply(reply.body));
  return parse_interaction_reply(reply.body, "its reply");
}

AnswerCheckInteraction::AnswerCheckInteraction(std::string name, int max_attempts, std::string correct_message,
                                               std::string retry_message)
    : Interaction(std::move(name)),
      max_attempts_(max_attempts),
      correct_message_(std::move(correct_message)),
      retry_message_(std::move(retry_message)) {
  HF_CHECK(max_attempts_ >= 1, "interaction '", this->name(), "': config.max_attempts: expected >= 1, got ", max_attempts_);
}

std::string AnswerCheckInteraction::describe() const { return "answer_check"; }

InteractionTurn AnswerCheckInteraction::run(const Json& messages, const Json& kwargs) const {
  HF_CHECK(kwargs.is_object() && kwargs.contains("ground_truth"),
           "the row's interaction_kwargs have no ground_truth to check the answer against");
  const Json& truth = kwargs["ground_truth"];
  std::string expected = truth.is_string() ? truth.get<std::string>() : truth.dump();
  HF_CHECK(messages.is_array(), "expected the conversation as a list of messages");
  int attempts = 0;
  std::string last;
  for (const auto& message : messages)
    if (message.is_object() && message.value("role", "") == "assistant") {
      ++attempts;
      last = content_of(message);
    }
  InteractionTurn turn;
  bool correct = attempts > 0 && !expected.empty() && last.find(expected) != std::string::npos;
  turn.reward = correct ? 1.0 : 0.0;
  turn.done = correct || attempts >= max_attempts_;
  turn.message = correct ? correct_message_ : turn.done ? "" : retry_message_;
  return turn;
}

namespace interaction_detail {

std::shared_ptr<const Interaction> make_interaction(const ConfigEntry& entry, const std::string& name,
                                                    const std::string& base_dir) {
  ConfigEntry config = entry.config_of_kind("command, http or answer_check");
  std::string type = config.string_or("type", "");
  auto bounds = [&] {
    ProcessBounds b;
    b.timeout_s = config.number_or("timeout_s", 30);
    b.max_output_bytes = config.integer_or("max_output_bytes", 1 << 20);
    if (!(b.timeout_s > 0)) config.fail("timeout_s", "expected a number > 0");
    if (b.max_output_bytes <= 0) config.fail("max_output_bytes", "expected an integer > 0");
    return b;
  };
  if (type == "command") {
    config.check_keys({"type", "command", "timeout_s", "max_output_bytes"});
    return std::make_shared<CommandInteraction>(name, config.command("command"), bounds(), base_dir);
  }
  if (type == "http") {
    config.check_keys({"type", "url", "timeout_s", "max_output_bytes", "allowed_hosts"});
    return std::make_shared<HttpInteraction>(name, config.string("url"), bounds(), config.strings_or("allowed_hosts", {}),
                                             entry.where());
  }
  if (type == "answer_check") {
    config.check_keys({"type", "max_attempts", "correct_message", "retry_message"});
    int64_t attempts = config.integer_or("max_attempts", 1);
    if (attempts < 1 || attempts > 1000) config.fail("max_attempts", "expected an integer from 1 to 1000");
    return std::make_shared<AnswerCheckInteraction>(name, static_cast<int>(attempts),
                                                    config.string_or("correct_message", "Correct."),
                                                    config.string_or("retry_message",
                                                                     "That is not right. Please try again."));
  }
  config.fail("type", "expected command, http or answer_check, got '" + type + "'");
}

}  // namespace interaction_detail

Interactions load_interaction_config_from_string(const std::string& text, const std::string& source_name,
                                                 const std::string& base_dir) {
  YAML::Node root = parse_config_yaml(text, source_name);
  Interactions out;
  std::vector<YAML::Node> entries = config_entries(root, "interaction", source_name);
  for (size_t i = 0; i < entries.size(); ++i) {
    std::string where = source_name + ": interaction[" + std::to_string(i) + "]";
    const YAML::Node& node = entries[i];
    if (!node.IsMap()) HF_FAIL(where, ": expected a map with name and config");
    ConfigEntry entry(node, where);
    entry.check_keys({"name", "class_name", "config"});
    std::string name = entry.string("name");
    ConfigEntry named(node, where + " ('" + name + "')");
    if (out.count(name)) named.fail("name", "an interaction named '" + name + "' is already defined");
    out[name] = make_interaction(named, name, base_dir);
  }
  return out;
}

Interactions load_interaction_config(const std::string& path) {
  ConfigFile file = read_config_file(path, "interaction config");
  return load_interaction_config_from_string(file.text, path, file.base_dir);
}

}  // namespace hybridflow::agent
