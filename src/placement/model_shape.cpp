#include "hybridflow/placement/model_shape.h"

#include "hybridflow/core/error.h"

namespace hybridflow::placement {

namespace {

ModelShape shape(const std::string& name, int64_t layers, int64_t hidden, int64_t intermediate, int64_t heads,
                 int64_t kv_heads, int64_t vocab, bool tied, bool qkv_bias) {
  ModelShape m;
  m.name = name;
  m.layers = layers;
  m.hidden = hidden;
  m.intermediate = intermediate;
  m.heads = heads;
  m.kv_heads = kv_heads;
  m.head_dim = hidden / heads;
  m.vocab = vocab;
  m.tied_embeddings = tied;
  m.qkv_bias = qkv_bias;
  return m;
}

}  // namespace

double ModelShape::layer_parameters() const {
  const double q = static_cast<double>(heads) * head_dim, kv = static_cast<double>(kv_heads) * head_dim;
  double attention = hidden * q + 2.0 * hidden * kv + q * hidden;
  if (qkv_bias) attention += q + 2.0 * kv;
  const double mlp = 3.0 * hidden * intermediate;
  return attention + mlp + 2.0 * hidden;
}

double ModelShape::parameters(bool value_head) const {
  const double embed = static_cast<double>(vocab) * hidden;
  const double head = value_head ? hidden : (tied_embeddings ? 0.0 : embed);
  return embed + head + layers * layer_parameters() + hidden;
}

double ModelShape::matmul_parameters(bool value_head) const {
  const double per_layer = layer_parameters() - 2.0 * hidden;
  const double head = value_head ? hidden : static_cast<double>(vocab) * hidden;  // a tied lm_head still multiplies
  return layers * per_layer + head;
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
  return {"llama-7b", "llama-13b", "llama-34b", "llama-70b", "qwen2.5-7b", "qwen2.5-32b", "qwen2.5-72b"};
}

// The published config.json dimensions: Llama 2 7B, 13B, 70B; Code Llama 34B (the Llama-2 family's 34B);
// Qwen2.5 7B, 32B and 72B (q/k/v biases; the 7B and larger untied).
ModelShape model_preset(const std::string& name) {
  if (name == "llama-7b") return shape(name, 32, 4096, 11008, 32, 32, 32000, false, false);
  if (name == "llama-13b") return shape(name, 40, 5120, 13824, 40, 40, 32000, false, false);
  if (name == "llama-34b") return shape(name, 48, 8192, 22016, 64, 8, 32000, false, false);
  if (name == "llama-70b") return shape(name, 80, 8192, 28672, 64, 8, 32000, false, false);
  if (name == "qwen2.5-7b") return shape(name, 28, 3584, 18944, 28, 4, 152064, false, true);
  if (name == "qwen2.5-32b") return shape(name, 64, 5120, 27648, 40, 8, 152064, false, true);
  if (name == "qwen2.5-72b") return shape(name, 80, 8192, 29568, 64, 8, 152064, false, true);
  std::string names;
  for (const auto& n : model_preset_names()) names += (names.empty() ? "" : ", ") + n;
  HF_FAIL("unknown model '", name, "'; expected a model directory (with config.json) or one of ", names);
}

}  // namespace hybridflow::placement
