#include "hybridflow/model/model_config.h"

#include <cmath>
#include <set>

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
                                     {"qwen3", "Qwen3ForCausalLM"},
                                     {"qwen2_moe", "Qwen2MoeForCausalLM"},
                                     {"qwen3_moe", "Qwen3MoeForCausalLM"},
                                     {"mixtral", "MixtralForCausalLM"}};
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
  HF_CHECK(sliding_window == 0 || model_type == "mistral" || model_type == "mixtral",
           "model config: sliding_window is implemented for mistral and mixtral only, got it for ", model_type);
  HF_CHECK(model_type != "mixtral" || !attention_bias, "model config: a mixtral model has no attention biases");
  if (is_moe_type()) validate_moe();
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

void ModelConfig::validate_moe() const {
  const char* experts_key = model_type == "mixtral" ? "num_local_experts" : "num_experts";
  HF_CHECK(moe.num_experts >= (model_type == "mixtral" ? 1 : 0), "model config: ", experts_key, " must be >= ",
           model_type == "mixtral" ? "1" : "0 (0: every layer dense)", ", got ", moe.num_experts);
  HF_CHECK(moe.decoder_sparse_step >= 1, "model config: decoder_sparse_step must be >= 1, got ", moe.decoder_sparse_step);
  for (int64_t layer : moe.mlp_only_layers)
    HF_CHECK(layer >= 0 && layer < num_hidden_layers, "model config: mlp_only_layers lists layer ", layer, ", not one of the ",
             num_hidden_layers, " layers");
  HF_CHECK(model_type == "qwen2_moe" || moe.shared_expert_intermediate_size == 0,
           "model config: shared_expert_intermediate_size is a qwen2_moe key, got it for ", model_type);
  HF_CHECK(model_type != "qwen2_moe" || moe.shared_expert_intermediate_size > 0,
           "model config: shared_expert_intermediate_size must be > 0, got ", moe.shared_expert_intermediate_size);
  HF_CHECK(moe.router_aux_loss_coef >= 0, "model config: router_aux_loss_coef must be >= 0, got ", moe.router_aux_loss_coef);
  if (num_moe_layers() == 0) return;
  HF_CHECK(moe.num_experts_per_tok >= 1 && moe.num_experts_per_tok <= moe.num_experts, "model config: ",
           "num_experts_per_tok must be in [1, ", experts_key, " = ", moe.num_experts, "], got ", moe.num_experts_per_tok);
  HF_CHECK(expert_intermediate_size() > 0, "model config: ",
           model_type == "mixtral" ? "intermediate_size" : "moe_intermediate_size", " must be > 0, got ",
           expert_intermediate_size());
}

bool ModelConfig::moe_layer(int64_t layer) const {
  if (!is_moe_type() || moe.num_experts <= 0) return false;
  if (model_type == "mixtral") return true;  // MixtralConfig has neither decoder_sparse_step nor mlp_only_layers
  for (int64_t dense : moe.mlp_only_layers)
    if (dense == layer) return false;
  return moe_layer_by_step(layer);
}

bool ModelConfig::moe_layer_by_step(int64_t layer) const {
  return moe.decoder_sparse_step >= 1 && (layer + 1) % moe.decoder_sparse_step == 0;
}

int64_t ModelConfig::num_moe_layers() const {
  if (!is_moe_type() || moe.num_experts <= 0 || num_hidden_layers <= 0) return 0;
  if (model_type == "mixtral") return num_hidden_layers;
  // Counted without visiting every layer: an absurd num_hidden_layers must not hang validate().
  int64_t n = moe.decoder_sparse_step >= 1 ? num_hidden_layers / moe.decoder_sparse_step : 0;
  std::set<int64_t> dense(moe.mlp_only_layers.begin(), moe.mlp_only_layers.end());
  for (int64_t layer : dense)
    if (layer >= 0 && layer < num_hidden_layers && moe_layer_by_step(layer)) --n;
  return n;
}

int64_t ModelConfig::num_parameters() const {
  return static_cast<int64_t>(std::llround(model_size(*this).parameters()));
}

}  // namespace hybridflow
