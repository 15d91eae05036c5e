#include "hybridflow/text/chat_template.h"

#include "text/jinja_evaluator.h"
#include "text/jinja_parser.h"
#include "text/jinja_scoping.h"
#include "text/jinja_unicode.h"

namespace hybridflow::text {

struct JinjaTemplate::Program {
  jinja::Body body;
  std::vector<std::string> undefined_at_entry;  // of the top-level scope
};

JinjaTemplate JinjaTemplate::parse(const std::string& source) {
  auto program = std::make_shared<Program>();
  program->body = jinja::parse_template(source);
  program->undefined_at_entry = jinja::analyze_scopes(program->body);
  JinjaTemplate t;
  t.program_ = std::move(program);
  return t;
}

std::string JinjaTemplate::render(const nlohmann::ordered_json& context) const {
  if (!context.is_object()) throw TemplateError("the template context must be a JSON object");
  jinja::Dict variables;
  try {
    for (const auto& [k, v] : context.items()) variables.set(k, jinja::Value::from_json(v));
  } catch (const jinja::EvalFailure& failure) {
    throw TemplateError(failure.what());
  }
  return jinja::render_template(program_->body, program_->undefined_at_entry, variables);
}

namespace {

// The names transformers gives a message's reasoning; the first is the one templates read.
constexpr const char* kReasoningFields[] = {"reasoning_content", "thinking", "reasoning"};

// What transformers' apply_chat_template and render_jinja_template do to each message before the template
// sees it: drop null-valued keys, then alias the reasoning as {"thinking": r, **message, "reasoning_content": r}.
nlohmann::ordered_json prepare_message(const nlohmann::ordered_json& message, size_t index) {
  if (!message.is_object())
    throw TemplateError("chat message " + std::to_string(index) + " must be an object, got " + message.type_name());
  nlohmann::ordered_json kept = nlohmann::ordered_json::object();
  for (const auto& [k, v] : message.items())
    if (!v.is_null()) kept[k] = v;
  const nlohmann::ordered_json* reasoning = nullptr;
  for (const char* field : kReasoningFields) {
    auto it = kept.find(field);
    if (it != kept.end()) {
      reasoning = &*it;
      break;
    }
  }
  if (reasoning == nullptr) return kept;
  const nlohmann::ordered_json r = *reasoning;
  nlohmann::ordered_json aliased = nlohmann::ordered_json::object();
  aliased["thinking"] = r;
  for (const auto& [k, v] : kept.items()) aliased[k] = v;  // a message's own "thinking" keeps the first slot
  aliased["reasoning_content"] = r;
  return aliased;
}

}  // namespace

ChatTemplate ChatTemplate::parse(const std::string& source) {
  ChatTemplate t;
  t.template_ = JinjaTemplate::parse(source);
  t.source_ = source;
  return t;
}

namespace {

// transformers marks the end of the message to continue with this, renders, and cuts there.
constexpr const char* kContinueTag = "CONTINUE_FINAL_MESSAGE_TAG ";

// Appends the tag to the last message's content (the last text block of a list content); returns
// the content before tagging, which must appear in the rendering.
std::string tag_final_message(nlohmann::ordered_json& messages, const std::string& template_source) {
  nlohmann::ordered_json& last = messages.back();
  auto content = last.find("content");
  if (content == last.end() || content->is_null())
    throw TemplateError("continue_final_message is set but the final message has no \"content\" to continue");
  if (template_source.find("content") == std::string::npos)
    throw TemplateError("continue_final_message is set but the chat template does not use \"content\"");
  if (content->is_array()) {
    for (auto block = content->rbegin(); block != content->rend(); ++block) {
      auto text = block->find("text");
      if (text == block->end() || !text->is_string()) continue;
      const std::string original = text->get<std::string>();
      *text = original + kContinueTag;
      return original;
    }
    throw TemplateError("continue_final_message is set but the final message has no text to continue");
  }
  if (!content->is_string()) throw TemplateError("continue_final_message needs a string (or text blocks) to continue");
  const std::string original = content->get<std::string>();
  *content = original + kContinueTag;
  return original;
}

// Python's str.strip / rstrip (Unicode whitespace), for the checks transformers makes on the final message.
std::string python_strip(const std::string& s, bool left, bool right) { return jinja::strip(s, nullptr, left, right); }

}  // namespace

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const ChatTemplateOptions& options) const {
  if (!messages.is_array()) throw TemplateError("chat messages must be a JSON list of message objects");
  if (messages.empty()) throw TemplateError("cannot apply a chat template to an empty conversation");
  if (!options.variables.is_object()) throw TemplateError("chat template variables must be a JSON object");
  if (options.continue_final_message && options.add_generation_prompt)
    throw TemplateError("continue_final_message and add_generation_prompt are not compatible");
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  nlohmann::ordered_json prepared = nlohmann::ordered_json::array();
  for (size_t i = 0; i < messages.size(); ++i) prepared.push_back(prepare_message(messages[i], i));
  std::string final_message;
  if (options.continue_final_message) final_message = tag_final_message(prepared, source_);
  context["messages"] = std::move(prepared);
  context["tools"] = options.tools;
  context["documents"] = options.documents;
  context["add_generation_prompt"] = options.add_generation_prompt;
  for (const auto& [k, v] : options.variables.items()) {
    if (k == "messages" || k == "tools" || k == "documents" || k == "add_generation_prompt")
      throw TemplateError("chat template variable '" + k + "' is set by the renderer; pass it through its own option");
    context[k] = v;
  }
  std::string rendered = template_.render(context);
  if (!options.continue_final_message) return rendered;
  // As transformers: cut at the tag; if the template trimmed the space after it, trim before it too.
  const std::string tag = kContinueTag;
  const std::string bare_tag = python_strip(tag, true, true);
  if (rendered.find(python_strip(final_message, true, true)) == std::string::npos ||
      rendered.find(bare_tag) == std::string::npos)
    throw TemplateError("continue_final_message is set but the final message does not appear in the rendered chat "
                        "(the template changes it)");
  const size_t at = rendered.rfind(bare_tag);
  if (rendered.compare(at, tag.size(), tag) == 0) return rendered.substr(0, at);
  return python_strip(rendered.substr(0, at), false, true);
}

std::string apply_chat_template(const TokenizerConfig& config, const nlohmann::ordered_json& messages,
                                bool add_generation_prompt, const nlohmann::ordered_json& tools,
                                const nlohmann::ordered_json& variables) {
  ChatTemplateOptions options;
  options.add_generation_prompt = add_generation_prompt;
  options.tools = tools;
  options.variables = variables;
  return apply_chat_template(config, messages, options);
}

std::string apply_chat_template(const TokenizerConfig& config, const nlohmann::ordered_json& messages,
                                const ChatTemplateOptions& options) {
  if (!options.variables.is_object()) throw TemplateError("chat template variables must be a JSON object");
  ChatTemplateOptions with_tokens = options;
  with_tokens.variables = config.special_token_variables();
  for (const auto& [k, v] : options.variables.items()) with_tokens.variables[k] = v;  // kwargs override special tokens
  return ChatTemplate::parse(config.template_for(!options.tools.is_null())).render(messages, with_tokens);
}

}  // namespace hybridflow::text
