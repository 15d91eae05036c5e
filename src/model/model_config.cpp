#include "hybridflow/model/model_config.h"

#include "hybridflow/core/error.h"
#include "hybridflow/model/model_size.h"

namespace hybridflow {
namespace {

struct ModelType {
  const char* name;
  const char* architecture;
};
constexpr ModelType kModelTypes[] = {{"llama", "LlamaForCausalLM"},
                                     {"mistral", "MistralForCausalLM"},
                                     {"qwen2", "Qwen2ForCausalLM"},
                                     {"qwen3", "Qwen3ForCausalLM"}};
constexpr const char* kRopeTypes[] = {"default", "linear", "dynamic", "llama3", "yarn"};

}  // namespace

bool is_supported_model_type(const std::string& model_type) {
  for (const ModelType& t : kModelTypes)
    if (model_type == t.name) return true;
  return false;
}

bool is_supported_rope_type(const std::string& rope_type) {
  for (const char* t : kRopeTypes)
    if (rope_type == t) return true;
  return false;
}

std::string supported_model_types() {
  std::string out;
  for (const ModelType& t : kModelTypes) out += (out.empty() ? "" : ", ") + std::string(t.name);
  return out;
}

std::string supported_rope_types() {
  std::string out;
  for (const char* t : kRopeTypes) out += (out.empty() ? "" : ", ") + std::string(t);
  return out;
}

std::string causal_lm_architecture(const std::string& model_type) {
  for (const ModelType& t : kModelTypes)
    if (model_type == t.name) return t.architecture;
  HF_FAIL("model_type '", model_type, "' is not one of ", supported_model_types());
}

void ModelConfig::validate() const {
  auto positive = [](const char* key, int64_t value) {
    HF_CHECK(value > 0, "model config: ", key, " must be > 0, got ", value);
  };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("num_key_value_heads", num_key_value_heads);
  positive("max_position_embeddings", max_position_embeddings);
  HF_CHECK(explicit_head_dim > 0 || hidden_size % num_attention_heads == 0, "model config: hidden_size (",
           hidden_size, ") must be divisible by num_attention_heads (", num_attention_heads,
           ") when head_dim is not given");
  HF_CHECK(explicit_head_dim >= 0, "model config: head_dim must be > 0, got ", explicit_head_dim);
  HF_CHECK(sliding_window >= 0, "model config: sliding_window must be >= 0 (0 = none), got ", sliding_window);
  HF_CHECK(num_attention_heads % num_key_value_heads == 0, "model config: num_attention_heads (",
           num_attention_heads, ") must be divisible by num_key_value_heads (", num_key_value_heads, ")");
  // Rotary embeddings rotate pairs of channels.
  HF_CHECK(head_dim() % 2 == 0, "model config: head_dim must be even, got ", head_dim());
  HF_CHECK(rope_theta > 0, "model config: rope_theta must be > 0, got ", rope_theta);
  HF_CHECK(rms_norm_eps > 0, "model config: rms_norm_eps must be > 0, got ", rms_norm_eps);
  HF_CHECK(torch_dtype == "float32" || torch_dtype == "float16" || torch_dtype == "bfloat16",
           "model config: torch_dtype must be float32, float16 or bfloat16, got '", torch_dtype, "'");
  HF_CHECK(is_supported_model_type(model_type), "model config: model_type must be one of ", supported_model_types(),
           ", got '", model_type, "'");
  HF_CHECK(sliding_window == 0 || model_type == "mistral",
           "model config: sliding_window is implemented for mistral only, got it for ", model_type);
  const RopeScaling& r = rope_scaling;
  HF_CHECK(is_supported_rope_type(r.type), "model config: rope_scaling type must be one of ", supported_rope_types(),
           ", got '", r.type, "'");
  HF_CHECK(!r.scaled() || r.factor > 0, "model config: rope_scaling factor must be > 0, got ", r.factor);
  HF_CHECK(r.type != "llama3" || r.high_freq_factor != r.low_freq_factor,
           "model config: rope_scaling high_freq_factor must differ from low_freq_factor (both ", r.low_freq_factor, ")");
  HF_CHECK(r.original_max_position_embeddings >= 0, "model config: rope_scaling original_max_position_embeddings ",
           "must be > 0, got ", r.original_max_position_embeddings);
  // num_parameters() and every tensor shape are int64: sizes whose product overflows it are no model (whether
  // one that fits does fit in memory is checked where it is built: model_size.h).
  const double parameters = model_size(*this).parameters();
  HF_CHECK(parameters < 4e18, "model config: vocab_size (", vocab_size, "), hidden_size (", hidden_size,
           "), intermediate_size (", intermediate_size, "), num_hidden_layers (", num_hidden_layers,
           ") and the head counts imply ", parameters, " parameters, which no machine holds");
}

int64_t ModelConfig::num_parameters() const {
  const int64_t kv_dim = num_key_value_heads * head_dim();
  const int64_t q_dim = num_attention_heads * head_dim();
  int64_t attention = hidden_size * q_dim * 2 + hidden_size * kv_dim * 2;  // q, o, k, v
  if (attention_bias) attention += q_dim + 2 * kv_dim;
  if (o_proj_bias()) attention += hidden_size;
  if (qk_norm()) attention += 2 * head_dim();
  const int64_t mlp = 3 * hidden_size * intermediate_size;
  const int64_t norms = 2 * hidden_size;
  const int64_t per_layer = attention + mlp + norms;
  int64_t total = vocab_size * hidden_size + num_hidden_layers * per_layer + hidden_size;
  if (!tie_word_embeddings) total += vocab_size * hidden_size;
  return total;
}

}  // namespace hybridflow
