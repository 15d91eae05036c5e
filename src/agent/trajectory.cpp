#include "hybridflow/agent/trajectory.h"

#include "hybridflow/core/error.h"
#include "hybridflow/text/chat_template.h"
#include "hybridflow/text/template_error.h"

namespace hybridflow::agent {
namespace trajectory_detail {

// Deltas are rendered after a conversation of one user message with this content (see the header).
constexpr const char* kBaseMarker = "hybridflow-delta-base";

Json concat(const Json& a, const Json& b) {
  Json out = a;
  for (const auto& m : b) out.push_back(m);
  return out;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

}  // namespace trajectory_detail

using namespace trajectory_detail;

TrajectoryBuilder::TrajectoryBuilder(const text::Tokenizer& tokenizer, const text::TokenizerConfig& config, Json tools,
                                     Json variables)
    : tokenizer_(tokenizer), config_(config), tools_(std::move(tools)), variables_(std::move(variables)) {
  // Probe: is a finished assistant turn (with reasoning) rendered the same, up to the end of its content,
  // once a tool result and once a new user message follow it?
  const std::string answer = "hybridflow-probe-answer";
  Json answered = Json::array({{{"role", "user"}, {"content", "What is 2+2?"}},
                               {{"role", "assistant"}, {"content", answer}, {"reasoning_content", "Two and two."}}});
  try {
    std::string before = render(answered, false);
    size_t at = before.rfind(answer);
    append_only_ = at != std::string::npos;
    before.resize(at == std::string::npos ? 0 : at + answer.size());
    for (const Json& next : {Json{{"role", "tool"}, {"content", "4"}}, Json{{"role", "user"}, {"content", "And 3+3?"}}})
      append_only_ = append_only_ && starts_with(render(concat(answered, Json::array({next})), true), before);
  } catch (const text::TemplateError&) {
    append_only_ = false;  // it refuses the probe (no tool role, say): no promise either way
  }
}

std::string TrajectoryBuilder::render(const Json& messages, bool add_generation_prompt) const {
  text::ChatTemplateOptions options;
  options.add_generation_prompt = add_generation_prompt;
  options.tools = tools_;
  options.variables = variables_;
  return text::apply_chat_template(config_, messages, options);
}

std::vector<int32_t> TrajectoryBuilder::encode(const std::string& text) const {
  return tokenizer_.encode(text, /*add_special_tokens=*/false);
}

void TrajectoryBuilder::start(const Json& messages) {
  HF_CHECK(messages.is_array() && !messages.empty(), "trajectory: the prompt must be a non-empty list of messages");
  trajectory_ = Trajectory();
  trajectory_.messages = messages;
  trajectory_.prompt_ids = encode(render(messages, true));
  last_delta_.clear();
  started_ = true;
}

void TrajectoryBuilder::append_sampled(const std::vector<int32_t>& ids, const Json& message) {
  HF_CHECK(started_, "trajectory: append_sampled before start");
  HF_CHECK(message.is_object() && message.value("role", "") == "assistant",
           "trajectory: append_sampled takes the assistant message parsed from the sampled ids");
  trajectory_.response_ids.insert(trajectory_.response_ids.end(), ids.begin(), ids.end());
  trajectory_.response_mask.insert(trajectory_.response_mask.end(), ids.size(), 1);
  trajectory_.messages.push_back(message);
  ++trajectory_.assistant_turns;
}

void TrajectoryBuilder::append_messages(const Json& new_messages) {
  last_delta_ = delta_ids(new_messages);
  trajectory_.response_ids.insert(trajectory_.response_ids.end(), last_delta_.begin(), last_delta_.end());
  trajectory_.response_mask.insert(trajectory_.response_mask.end(), last_delta_.size(), 0);
  for (const auto& m : new_messages) trajectory_.messages.push_back(m);
  ++trajectory_.appended_turns;
}

std::vector<int32_t> TrajectoryBuilder::delta_ids(const Json& new_messages) const {
  HF_CHECK(started_, "trajectory: append_messages before start");
  HF_CHECK(new_messages.is_array() && !new_messages.empty(), "trajectory: expected a non-empty list of new messages");
  // Only after a sampled turn: the previous delta already ends with the generation prompt.
  HF_CHECK(trajectory_.messages.back().value("role", "") == "assistant" && !trajectory_.response_ids.empty() &&
               trajectory_.response_mask.back() == 1,
           "trajectory: new messages may only follow a sampled assistant turn");
  int32_t end = trajectory_.response_ids.back();
  HF_CHECK(tokenizer_.is_special(end), "trajectory: the last assistant turn ended without an end-of-turn token (it ",
           "was cut off at the length limit); no tool result or user turn may follow it");
  // The new messages' text: what the template writes after the base's end-of-turn token, through the
  // generation prompt. The text the template writes after an end-of-turn token (Qwen's "\n") is the same
  // after every turn, so it stands for what follows the sampled one.
  const std::string end_text = tokenizer_.decode({end}, /*skip_special_tokens=*/false);
  const Json base = Json::array({{{"role", "user"}, {"content", kBaseMarker}}});
  const std::string extended = render(concat(base, new_messages), true);
  size_t marker = extended.find(kBaseMarker);
  size_t cut = marker == std::string::npos ? std::string::npos : extended.find(end_text, marker);
  HF_CHECK(cut != std::string::npos, "trajectory: the chat template does not end a turn with '", end_text,
           "', the token that ended the sampled turn; the conversation cannot be continued as tokens");
  std::string delta = extended.substr(cut + end_text.size());
  HF_CHECK(!delta.empty(), "trajectory: the chat template renders the new messages as nothing");
  return encode(delta);
}

}  // namespace hybridflow::agent
