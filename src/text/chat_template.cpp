#include "hybridflow/text/chat_template.h"

#include "text/jinja_evaluator.h"
#include "text/jinja_parser.h"
#include "text/jinja_scoping.h"

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

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const ChatTemplateOptions& options) const {
  if (!messages.is_array()) throw TemplateError("chat messages must be a JSON list of message objects");
  if (messages.empty()) throw TemplateError("cannot apply a chat template to an empty conversation");
  if (!options.variables.is_object()) throw TemplateError("chat template variables must be a JSON object");
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  nlohmann::ordered_json prepared = nlohmann::ordered_json::array();
  for (size_t i = 0; i < messages.size(); ++i) prepared.push_back(prepare_message(messages[i], i));
  context["messages"] = std::move(prepared);
  context["tools"] = options.tools;
  context["documents"] = options.documents;
  context["add_generation_prompt"] = options.add_generation_prompt;
  for (const auto& [k, v] : options.variables.items()) {
    if (k == "messages" || k == "tools" || k == "documents" || k == "add_generation_prompt")
      throw TemplateError("chat template variable '" + k + "' is set by the renderer; pass it through its own option");
    context[k] = v;
  }
  return template_.render(context);
}

std::string apply_chat_template(const TokenizerConfig& config, const nlohmann::ordered_json& messages,
                                bool add_generation_prompt, const nlohmann::ordered_json& tools,
                                const nlohmann::ordered_json& variables) {
  ChatTemplateOptions options;
  options.add_generation_prompt = add_generation_prompt;
  options.tools = tools;
  options.variables = config.special_token_variables();
  if (!variables.is_object()) throw TemplateError("chat template variables must be a JSON object");
  for (const auto& [k, v] : variables.items()) options.variables[k] = v;  // kwargs override special tokens
  return ChatTemplate::parse(config.template_for(!tools.is_null())).render(messages, options);
}

}  // namespace hybridflow::text
