// The architecture of a Llama / Mistral / Qwen2 / Qwen3 family decoder, with the field names of Hugging
// Face's config.json so that a directory written here loads in transformers and vice versa.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace hybridflow {

// RoPE frequency scaling: config.json's rope_scaling (transformers 4) or rope_parameters (transformers 5).
// The fields are transformers' keys; each type reads only its own (model/rotary.h computes them).
struct RopeScaling {
  std::string type = "default";  // default | linear | dynamic | llama3 | yarn
  double factor = 1.0;           // linear, dynamic, llama3, yarn
  double low_freq_factor = 1.0;  // llama3
  double high_freq_factor = 4.0;
  // llama3 and yarn: the context length the model was pretrained with (0 = max_position_embeddings).
  int64_t original_max_position_embeddings = 0;
  // yarn: the cos/sin scale; when unset it follows from factor (and mscale / mscale_all_dim when both set).
  std::optional<double> attention_factor;
  double beta_fast = 32.0, beta_slow = 1.0;
  double mscale = 0.0, mscale_all_dim = 0.0;
  bool truncate = true;

  bool scaled() const { return type != "default"; }
};

struct ModelConfig {
  std::string architecture = "LlamaForCausalLM";  // MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM
  std::string model_type = "llama";                // mistral, qwen2, qwen3
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // grouped-query attention when < num_attention_heads
  int64_t max_position_embeddings = 2048;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  // config.json's head_dim when it gives one (Qwen3 always does); 0 = hidden_size / num_attention_heads.
  int64_t explicit_head_dim = 0;
  // Mistral: a query sees only the last sliding_window keys (0 = no window).
  int64_t sliding_window = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;      // q/k/v projections carry a bias (Qwen2: always; Mistral: never)
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;
  int64_t pad_token_id = -1;
  std::string torch_dtype = "float32";  // float32 | float16 | bfloat16: the dtype weights are stored in

  int64_t head_dim() const { return explicit_head_dim > 0 ? explicit_head_dim : hidden_size / num_attention_heads; }
  // transformers gives Llama's and Qwen3's o_proj a bias with attention_bias; Qwen2's never has one.
  bool o_proj_bias() const { return attention_bias && model_type != "qwen2"; }
  // Qwen3 normalises each query and key head (RMSNorm over head_dim) before the rotary embedding.
  bool qk_norm() const { return model_type == "qwen3"; }
  // Throws hybridflow::Error naming the first inconsistent field.
  void validate() const;
  // Parameter count of the language model. A value-head model (HeadKind::kValue) has no lm_head and
  // adds score.weight: num_parameters() - (tied ? 0 : vocab*hidden) + hidden_size.
  int64_t num_parameters() const;
};

// The model types and RoPE scaling types this decoder implements, each named in one place for every
// check and message: "llama, mistral, qwen2, qwen3" and "default, linear, dynamic, llama3, yarn".
bool is_supported_model_type(const std::string& model_type);
bool is_supported_rope_type(const std::string& rope_type);
std::string supported_model_types();
std::string supported_rope_types();
// transformers' causal-LM class of a supported model type ("qwen3" -> "Qwen3ForCausalLM").
std::string causal_lm_architecture(const std::string& model_type);

// A named shape of model/model_presets.h: a test shape (tiny, small, base, ...) with `vocab_size` rows, or a
// published architecture (qwen3-0.6b, llama3.2-1b, ...) with its own vocabulary, which must hold `vocab_size`
// tokens. Error naming the presets for an unknown name.
ModelConfig preset_model_config(const std::string& name, int64_t vocab_size);

}  // namespace hybridflow
