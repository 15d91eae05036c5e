// Chat templates: the Jinja `chat_template` of a Hugging Face tokenizer_config.json, rendered in C++
// byte-for-byte as transformers' apply_chat_template(..., tokenize=False) renders it (jinja2 with
// trim_blocks, lstrip_blocks, loop controls, transformers' tojson / raise_exception / strftime_now).
// A template using a Jinja feature hybridflow does not implement fails with a TemplateError naming the
// feature and its line and column, never with different output.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "hybridflow/text/template_error.h"
#include "hybridflow/text/tokenizer_config.h"

namespace hybridflow::text {

// Any Jinja template (the chat specifics are in ChatTemplate): parsed once, rendered many times.
class JinjaTemplate {
 public:
  // Throws TemplateError on a syntax error or an unsupported tag, filter or test.
  static JinjaTemplate parse(const std::string& source);
  // `context` must be a JSON object: its keys are the template's variables. Throws TemplateError
  // (raise_exception's message is TemplateError::message()).
  std::string render(const nlohmann::ordered_json& context) const;

 private:
  struct Program;
  std::shared_ptr<const Program> program_;
};

struct ChatTemplateOptions {
  bool add_generation_prompt = false;
  // transformers' continue_final_message=True: the prompt ends inside the last message (an assistant
  // prefill to continue), cut right after its content instead of closing the turn. Not with
  // add_generation_prompt.
  bool continue_final_message = false;
  // JSON schemas of the tools (a list), or null for none: templates test `tools` for truthiness.
  nlohmann::ordered_json tools = nullptr;
  // Retrieval documents (a list of objects), or null.
  nlohmann::ordered_json documents = nullptr;
  // Further template variables, as apply_chat_template's **kwargs: bos_token, eos_token,
  // enable_thinking, ... (must be an object; may not redefine the names above).
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  static ChatTemplate parse(const std::string& source);

  // One conversation: a non-empty list of message objects. As transformers does before rendering,
  // keys whose value is null are dropped from each message, and a message's reasoning (under
  // reasoning_content, thinking or reasoning) is made visible under both `reasoning_content` and `thinking`.
  std::string render(const nlohmann::ordered_json& messages, const ChatTemplateOptions& options = {}) const;

  const std::string& source() const { return source_; }

 private:
  JinjaTemplate template_;
  std::string source_;
};

// apply_chat_template(messages, tools=tools, add_generation_prompt=..., tokenize=False, **variables)
// on a tokenizer loaded from `config`: its template (the "tool_use" one when tools are given and it has
// one), and its special tokens (bos_token, eos_token, ...) as template variables, which `variables` may
// override. Throws hybridflow::Error if the config has no chat template.
std::string apply_chat_template(const TokenizerConfig& config, const nlohmann::ordered_json& messages,
                                bool add_generation_prompt, const nlohmann::ordered_json& tools = nullptr,
                                const nlohmann::ordered_json& variables = nlohmann::ordered_json::object());
// The same with all options; options.variables are added to (and override) the config's special tokens.
std::string apply_chat_template(const TokenizerConfig& config, const nlohmann::ordered_json& messages,
                                const ChatTemplateOptions& options);

}  // namespace hybridflow::text
