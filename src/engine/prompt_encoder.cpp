#include "hybridflow/engine/prompt_encoder.h"

#include "hybridflow/core/config.h"
#include "hybridflow/core/config_json.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/logging.h"
#include "hybridflow/text/chat_template.h"

namespace hybridflow {

Truncation parse_truncation(const std::string& value) {
  if (value == "error") return Truncation::kError;
  if (value == "left") return Truncation::kLeft;
  if (value == "right") return Truncation::kRight;
  if (value == "middle") return Truncation::kMiddle;
  HF_FAIL("data.truncation: expected error | left | right | middle, got '", value, "'");
}

std::vector<int64_t> truncate_prompt(const std::vector<int64_t>& ids, int64_t max_length, Truncation mode) {
  const auto n = static_cast<int64_t>(ids.size());
  if (n <= max_length || mode == Truncation::kError) return ids;
  switch (mode) {
    case Truncation::kLeft: return {ids.end() - max_length, ids.end()};
    case Truncation::kRight: return {ids.begin(), ids.begin() + max_length};
    case Truncation::kMiddle: {
      const int64_t head = max_length / 2, tail = max_length - head;
      std::vector<int64_t> out(ids.begin(), ids.begin() + head);
      out.insert(out.end(), ids.end() - tail, ids.end());
      return out;
    }
    case Truncation::kError: break;
  }
  return ids;
}

PromptOptions PromptOptions::from_config(const Config& config) {
  PromptOptions o;
  o.max_prompt_length = config.get<int64_t>("data.max_prompt_length");
  HF_CHECK(o.max_prompt_length > 0, "data.max_prompt_length must be > 0 tokens, got ", o.max_prompt_length);
  o.truncation = parse_truncation(config.get<std::string>("data.truncation"));
  o.filter_overlong_prompts = config.get<bool>("data.filter_overlong_prompts");
  o.apply_chat_template = config.get<bool>("data.apply_chat_template");
  o.add_bos = config.get<bool>("data.add_bos");
  o.chat_template_kwargs = config_to_json(config.subtree("data.apply_chat_template_kwargs"));
  for (const char* reserved : {"messages", "tools", "documents", "add_generation_prompt", "continue_final_message"})
    HF_CHECK(!o.chat_template_kwargs.contains(reserved), "data.apply_chat_template_kwargs.", reserved,
             ": the trainer sets this template variable itself; apply_chat_template_kwargs may add others ",
             "(enable_thinking, ...)");
  if (!config.is_null("actor_rollout_ref.model.custom_chat_template")) {
    o.custom_chat_template = config.get<std::string>("actor_rollout_ref.model.custom_chat_template");
    try {
      (void)text::ChatTemplate::parse(o.custom_chat_template);
    } catch (const std::exception& e) {
      HF_FAIL("actor_rollout_ref.model.custom_chat_template: not a template hybridflow can render: ", e.what());
    }
  }
  return o;
}

PromptEncoder::PromptEncoder(const Tokenizer& tokenizer, std::string model_dir, PromptOptions options)
    : tokenizer_(tokenizer), model_dir_(std::move(model_dir)), options_(options) {}

const text::TokenizerConfig& PromptEncoder::chat_config(const PromptRow& row) {
  if (chat_config_) return *chat_config_;
  const std::string why = row.is_chat() ? "has chat messages" : "is a plain string and data.apply_chat_template is true";
  if (!options_.custom_chat_template.empty()) {
    text::TokenizerConfig config;  // the model's special tokens stay template variables
    const std::string file = model_dir_ + "/tokenizer_config.json";
    if (!model_dir_.empty() && file_exists(file)) config = text::TokenizerConfig::load(file);
    config.replace_chat_template(options_.custom_chat_template);
    chat_config_ = std::move(config);
    return *chat_config_;
  }
  HF_CHECK(!model_dir_.empty(), row.where, ": the prompt ", why, ", which needs the model's chat template, but ",
           "model.path is empty (a preset's character tokenizer has no template); set model.path to a model directory ",
           "with tokenizer_config.json");
  const std::string file = model_dir_ + "/tokenizer_config.json";
  HF_CHECK(file_exists(file), row.where, ": the prompt ", why, ", which needs the model's chat template, but model ",
           "directory ", model_dir_, " has no tokenizer_config.json");
  text::TokenizerConfig config = text::TokenizerConfig::load(file);
  HF_CHECK(config.chat_template || !config.named_chat_templates.empty(), row.where, ": the prompt ", why,
           ", which needs the model's chat template, but model directory ", model_dir_, " has none (no chat_template in ",
           "tokenizer_config.json, no chat_template.jinja)");
  chat_config_ = std::move(config);
  return *chat_config_;
}

std::vector<int64_t> PromptEncoder::encode_row(const PromptRow& row, std::string* text) {
  if (!row.is_chat() && !options_.apply_chat_template) {
    *text = row.prompt;
    return tokenizer_.encode(row.prompt, options_.add_bos);
  }
  const nlohmann::ordered_json messages =
      row.is_chat() ? row.messages
                    : nlohmann::ordered_json::array({{{"role", "user"}, {"content", row.prompt}}});
  const auto& config = chat_config(row);
  try {
    text::ChatTemplateOptions template_options;
    template_options.add_generation_prompt = true;
    template_options.variables = options_.chat_template_kwargs;
    *text = text::apply_chat_template(config, messages, template_options);
  } catch (const std::exception& e) {
    const std::string which = options_.custom_chat_template.empty() ? "the chat template of " + model_dir_
                                                                     : "actor_rollout_ref.model.custom_chat_template";
    HF_FAIL(row.where, ": ", which, " failed on this prompt: ", e.what());
  }
  return tokenizer_.encode(*text, /*add_bos=*/false);
}

std::vector<EncodedPrompt> PromptEncoder::encode(const std::vector<PromptRow>& rows, const std::string& file) {
  std::vector<EncodedPrompt> out;
  out.reserve(rows.size());
  const int64_t limit = options_.max_prompt_length;
  int64_t dropped = 0, cut = 0;
  for (const PromptRow& row : rows) {
    EncodedPrompt p;
    p.ids = encode_row(row, &p.text);
    HF_CHECK(!p.ids.empty(), row.where, ": the prompt encodes to no tokens");
    const auto length = static_cast<int64_t>(p.ids.size());
    if (length > limit) {
      if (options_.filter_overlong_prompts) {
        ++dropped;
        continue;
      }
      HF_CHECK(options_.truncation != Truncation::kError, row.where, ": the prompt is ", length,
               " tokens, longer than data.max_prompt_length = ", limit, "; raise it, or set data.truncation to left | ",
               "right | middle, or data.filter_overlong_prompts: true");
      p.ids = truncate_prompt(p.ids, limit, options_.truncation);
      ++cut;
    }
    p.answer = row.answer;
    p.data_source = row.data_source;
    p.extra_info = row.extra_info;
    p.messages = row.is_chat() ? row.messages : nlohmann::ordered_json(row.prompt);
    p.agent_name = row.agent_name;
    p.tools_kwargs = row.tools_kwargs;
    p.interaction_kwargs = row.interaction_kwargs;
    out.push_back(std::move(p));
  }
  if (dropped > 0) {
    HF_CHECK(!out.empty(), file, ": all ", rows.size(), " prompts are longer than data.max_prompt_length = ", limit,
             " tokens and data.filter_overlong_prompts dropped them all");
    log_info(file, ": dropped ", dropped, " of ", rows.size(), " prompts longer than data.max_prompt_length = ", limit,
             " tokens (data.filter_overlong_prompts)");
  }
  if (cut > 0)
    log_info(file, ": cut ", cut, " of ", rows.size(), " prompts to data.max_prompt_length = ", limit,
             " tokens (data.truncation)");
  return out;
}

}  // namespace hybridflow
