// The architecture of a Llama / Mistral / Qwen2 / Qwen3 family decoder, with the field names of Hugging
// Face's config.json so that a directory written here loads in transformers and vice versa.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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

// Mixture of experts (model types qwen2_moe, qwen3_moe, mixtral), with config.json's names: each sparse layer's
// MLP is a router over num_experts experts, of which each token uses num_experts_per_tok (model/moe.h).
struct MoeConfig {
  int64_t num_experts = 0;            // qwen: num_experts; mixtral: num_local_experts. 0 = every layer dense
  int64_t num_experts_per_tok = 0;    // top k
  int64_t moe_intermediate_size = 0;  // each expert's width (mixtral: its intermediate_size)
  int64_t shared_expert_intermediate_size = 0;  // qwen2_moe: the always-on shared expert's width
  bool norm_topk_prob = false;        // renormalise the top-k probabilities to sum 1 (mixtral: always)
  int64_t decoder_sparse_step = 1;    // qwen: layer i is sparse when (i + 1) % step == 0 ...
  std::vector<int64_t> mlp_only_layers;  // ... and i is not listed here
  double router_aux_loss_coef = 0.001;  // weight of the load-balancing loss added to the training loss
  bool output_router_logits = false;    // transformers' switch for computing that loss (kept for round trips)
};

struct ModelConfig {
  // Llama/Mistral/Qwen2/Qwen3ForCausalLM, Qwen2Moe/Qwen3Moe/MixtralForCausalLM
  std::string architecture = "LlamaForCausalLM";
  std::string model_type = "llama";  // mistral, qwen2, qwen3, qwen2_moe, qwen3_moe, mixtral
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
  MoeConfig moe;                        // used by the mixture-of-experts types only

  int64_t head_dim() const { return explicit_head_dim > 0 ? explicit_head_dim : hidden_size / num_attention_heads; }
  // transformers gives Llama's and Qwen3's o_proj a bias with attention_bias; Qwen2's never has one.
  bool o_proj_bias() const { return attention_bias && model_type != "qwen2" && model_type != "qwen2_moe"; }
  // Qwen3 normalises each query and key head (RMSNorm over head_dim) before the rotary embedding.
  bool qk_norm() const { return model_type == "qwen3" || model_type == "qwen3_moe"; }
  // A mixture-of-experts model type (its layers may still all be dense: moe_layer()).
  bool is_moe_type() const { return model_type == "qwen2_moe" || model_type == "qwen3_moe" || model_type == "mixtral"; }
  // Whether decoder layer `layer` routes over experts (transformers' rule: decoder_sparse_step, mlp_only_layers).
  bool moe_layer(int64_t layer) const;
  int64_t num_moe_layers() const;
  // The sparse block's module name in a layer: "mlp" (qwen) or "block_sparse_moe" (mixtral), and an expert's
  // projection names: gate_proj / up_proj / down_proj, mixtral's w1 / w3 / w2.
  const char* moe_block_name() const { return model_type == "mixtral" ? "block_sparse_moe" : "mlp"; }
  const char* expert_gate_name() const { return model_type == "mixtral" ? "w1" : "gate_proj"; }
  const char* expert_up_name() const { return model_type == "mixtral" ? "w3" : "up_proj"; }
  const char* expert_down_name() const { return model_type == "mixtral" ? "w2" : "down_proj"; }
  int64_t expert_intermediate_size() const {
    return model_type == "mixtral" ? intermediate_size : moe.moe_intermediate_size;
  }
  bool shared_expert() const { return model_type == "qwen2_moe"; }
  // Throws hybridflow::Error naming the first inconsistent field.
  void validate() const;
  // Parameter count of the language model. A value-head model (HeadKind::kValue) has no lm_head and
  // adds score.weight: num_parameters() - (tied ? 0 : vocab*hidden) + hidden_size. Every expert counts
  // (model_size.h also gives the parameters a token uses).
  int64_t num_parameters() const;

 private:
  void validate_moe() const;
  bool moe_layer_by_step(int64_t layer) const;
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
