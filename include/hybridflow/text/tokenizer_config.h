// tokenizer_config.json: what hybridflow needs from it besides the vocabulary (which is in
// tokenizer.json): the chat template, the special tokens a template refers to, and the flags that say
// whether BOS/EOS are added. Errors name the file and the key.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace hybridflow::text {

struct TokenizerConfig {
  // The template transformers uses by default: the string form, or the entry named "default" of the
  // list form [{"name": ..., "template": ...}]. Empty when the config has neither.
  std::optional<std::string> chat_template;
  // Every template of the list form by name (e.g. "default", "tool_use"); empty for the string form.
  std::map<std::string, std::string> named_chat_templates;

  // Special tokens as strings (a token may be written as {"content": ...}); absent or null: nullopt.
  std::optional<std::string> bos_token, eos_token, unk_token, sep_token, pad_token, cls_token, mask_token;
  std::optional<bool> add_bos_token, add_eos_token;
  // nullopt when absent or when it is transformers' "no limit" value int(1e30), which no int64 holds.
  std::optional<std::int64_t> model_max_length;

  // `source` names the file in error messages.
  static TokenizerConfig from_json(const nlohmann::ordered_json& json, const std::string& source);
  // Reads tokenizer_config.json at `path`. As transformers does, a chat_template.jinja next to it
  // replaces the config's chat_template.
  static TokenizerConfig load(const std::string& path);

  // The template apply_chat_template picks: the "tool_use" one when `with_tools` and the config has one,
  // else the default. Throws hybridflow::Error naming the file if there is none.
  const std::string& template_for(bool with_tools) const;
  // As transformers' `tokenizer.chat_template = source`: this one template from now on, with tools or without
  // (verl's actor_rollout_ref.model.custom_chat_template).
  void replace_chat_template(std::string source);

  // The special tokens transformers passes to every chat template (bos_token, eos_token, unk_token,
  // sep_token, pad_token, cls_token, mask_token), those that are set.
  nlohmann::ordered_json special_token_variables() const;

  std::string source;  // the file it was read from (for messages)
};

}  // namespace hybridflow::text
