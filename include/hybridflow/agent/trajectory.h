// A multi-turn conversation as the token ids the policy trains on, built token in, token out: the
// assistant's ids are the ids it sampled, never decoded and encoded again, and each tool result or user
// turn is appended as the ids of the chat template's rendering of the new messages only (with the
// generation prompt of the next assistant turn). The response mask is 1 exactly on the sampled ids.
//
// The delta of new messages N is the text the template writes for them after a turn's end-of-turn token,
// through the next generation prompt: rendered after a fixed one-message base conversation (verl's
// approach), cut right after that message's end-of-turn token, so it includes what the template writes
// after every end-of-turn token (Qwen's "\n" after <|im_end|>), which the model did not sample. It is
// tokenized on its own; it starts right after a special token, where tokenization starts afresh anyway,
// so its ids are those of the whole conversation's tokenization.
//
// The trajectory is what the model saw when it sampled. A re-render of the finished conversation gives
// the same ids only for a template that renders earlier turns unchanged as the conversation grows. Qwen3
// does not: it drops the reasoning of assistant turns before the latest user message. The builder probes
// the template at construction (append_only()); the trajectory keeps the reasoning the model sampled
// either way, and a caller may warn that a re-render would differ.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hybridflow/agent/tool.h"
#include "hybridflow/text/tokenizer.h"
#include "hybridflow/text/tokenizer_config.h"

namespace hybridflow::agent {

struct Trajectory {
  std::vector<int32_t> prompt_ids;      // the first render, with the generation prompt
  std::vector<int32_t> response_ids;    // everything after it, sampled and appended
  std::vector<uint8_t> response_mask;   // 1: sampled by the policy; 0: tool/user turns and template tokens
  Json messages = Json::array();        // the conversation so far (OpenAI messages)
  int assistant_turns = 0;
  int appended_turns = 0;               // append_messages calls (tool results, user turns)
};

class TrajectoryBuilder {
 public:
  // `tools`: the schemas the template renders (null for none); `variables`: template variables such as
  // enable_thinking. The tokenizer and config must outlive the builder.
  TrajectoryBuilder(const text::Tokenizer& tokenizer, const text::TokenizerConfig& config, Json tools = nullptr,
                    Json variables = Json::object());

  // Whether the template renders earlier turns unchanged as a conversation grows (see above): then the
  // trajectory equals the ids of a re-render of the finished conversation.
  bool append_only() const { return append_only_; }

  // Starts with the prompt messages: prompt_ids are the render with the generation prompt.
  void start(const Json& messages);
  // A sampled assistant turn: `ids` as sampled (mask 1), and `message`, the turn as parsed from them
  // (content, tool_calls), added to the conversation for the template's later renders.
  void append_sampled(const std::vector<int32_t>& ids, const Json& message);
  // Tool results or a user turn (mask 0): the template's rendering of `new_messages` only, then the
  // generation prompt. Throws when the last sampled turn did not end with a special token (it was cut
  // off; nothing may follow it) or the template renders the new messages as nothing.
  void append_messages(const Json& new_messages);
  // The ids append_messages would append (for a caller to check a length budget first).
  std::vector<int32_t> delta_ids(const Json& new_messages) const;

  const Trajectory& trajectory() const { return trajectory_; }
  // The ids appended by the last append_messages (for the engine to prefill).
  const std::vector<int32_t>& last_delta() const { return last_delta_; }

 private:
  std::string render(const Json& messages, bool add_generation_prompt) const;
  std::vector<int32_t> encode(const std::string& text) const;

  const text::Tokenizer& tokenizer_;
  const text::TokenizerConfig& config_;
  Json tools_;
  Json variables_;
  bool append_only_ = true;
  Trajectory trajectory_;
  std::vector<int32_t> last_delta_;
  bool started_ = false;
};

}  // namespace hybridflow::agent
