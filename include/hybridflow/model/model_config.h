// The architecture of a Llama / Qwen2 family decoder, with the field names of Hugging Face's
// config.json so that a directory written here loads in transformers and vice versa.
#pragma once

#include <cstdint>
#include <string>

namespace hybridflow {

struct ModelConfig {
  std::string architecture = "LlamaForCausalLM";  // or "Qwen2ForCausalLM"
  std::string model_type = "llama";                // or "qwen2"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // grouped-query attention when < num_attention_heads
  int64_t max_position_embeddings = 2048;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;      // q/k/v projections carry a bias (Qwen2: true)
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;
  int64_t pad_token_id = -1;
  std::string torch_dtype = "float32";  // float32 | float16 | bfloat16: the dtype weights are stored in

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  // transformers gives Llama's o_proj a bias with attention_bias; Qwen2's never has one.
  bool o_proj_bias() const { return attention_bias && model_type != "qwen2"; }
  // Throws hybridflow::Error naming the first inconsistent field.
  void validate() const;
  // Parameter count of the language model. A value-head model (HeadKind::kValue) has no lm_head and
  // adds score.weight: num_parameters() - (tied ? 0 : vocab*hidden) + hidden_size.
  int64_t num_parameters() const;
};

// Named sizes for `hybridflow init --preset`: tiny (tests, seconds on a laptop), small, base.
ModelConfig preset_model_config(const std::string& name, int64_t vocab_size);

}  // namespace hybridflow
