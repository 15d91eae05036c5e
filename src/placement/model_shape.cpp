#include "hybridflow/placement/model_shape.h"

#include "hybridflow/core/error.h"
#include "hybridflow/model/model_presets.h"
#include "hybridflow/model/model_size.h"

namespace hybridflow::placement {

ModelConfig ModelShape::model_config() const {
  ModelConfig c;
  c.model_type = !model_type.empty() ? model_type : qk_norm ? "qwen3" : qkv_bias ? "qwen2" : "llama";
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.explicit_head_dim = head_dim;
  c.tie_word_embeddings = tied_embeddings;
  c.attention_bias = qkv_bias;
  c.moe = moe;
  return c;
}

ModelShape model_shape_of(const ModelConfig& c, const std::string& name) {
  ModelShape m;
  m.name = name;
  m.layers = c.num_hidden_layers;
  m.hidden = c.hidden_size;
  m.intermediate = c.intermediate_size;
  m.heads = c.num_attention_heads;
  m.kv_heads = c.num_key_value_heads;
  m.head_dim = c.head_dim();
  m.vocab = c.vocab_size;
  m.tied_embeddings = c.tie_word_embeddings;
  m.qkv_bias = c.attention_bias;
  m.qk_norm = c.qk_norm();
  m.model_type = c.model_type;
  m.moe = c.moe;
  m.validate();
  return m;
}

double ModelShape::layer_parameters() const {
  // The model layer's count of the decoder layers (attention, MLP), per layer, plus its two norms.
  const ModelSize size = model_size(model_config());
  return (size.attention + size.mlp + size.experts) / static_cast<double>(layers) + 2.0 * hidden;
}

double ModelShape::parameters(bool value_head) const { return model_size(model_config(), value_head).parameters(); }

double ModelShape::active_parameters(bool value_head) const {
  return model_size(model_config(), value_head).active_parameters();
}

double ModelShape::matmul_parameters(bool value_head) const {
  const ModelSize size = model_size(model_config());
  const double head = value_head ? hidden : static_cast<double>(vocab) * hidden;  // a tied lm_head still multiplies
  return size.attention + size.mlp + size.active_experts + head;
}

double ModelShape::forward_flops(double tokens, double seq, bool value_head) const {
  const double attention_per_token = 4.0 * layers * heads * head_dim * (seq / 2.0);
  return tokens * (2.0 * matmul_parameters(value_head) + attention_per_token);
}

double ModelShape::decode_flops(double context) const {
  return 2.0 * matmul_parameters(false) + 4.0 * layers * heads * head_dim * context;
}

double ModelShape::kv_bytes_per_token(double dtype_bytes) const {
  return 2.0 * layers * kv_heads * head_dim * dtype_bytes;
}

void ModelShape::validate() const {
  const std::string what = name.empty() ? std::string("model") : "model '" + name + "'";
  for (const auto& [field, value] :
       {std::pair<const char*, int64_t>{"num_hidden_layers", layers}, {"hidden_size", hidden},
        {"intermediate_size", intermediate}, {"num_attention_heads", heads}, {"num_key_value_heads", kv_heads},
        {"head_dim", head_dim}, {"vocab_size", vocab}})
    HF_CHECK(value > 0, what, ": ", field, " must be positive, got ", value);
  HF_CHECK(heads % kv_heads == 0, what, ": num_attention_heads ", heads, " is not a multiple of num_key_value_heads ",
           kv_heads);
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const ModelPreset& p : model_presets())
    if (p.published) names.push_back(p.name);
  return names;
}

ModelShape model_preset(const std::string& name) {
  const std::optional<ModelPreset> preset = find_model_preset(name);
  HF_CHECK(preset && preset->published, "unknown model '", name,
           "'; expected a model directory (with config.json) or one of ", model_preset_list(true));
  return model_shape_of(preset->config, name);
}

}  // namespace hybridflow::placement
