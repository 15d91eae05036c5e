// The dimensions of a Llama / Qwen-family decoder that its costs follow from: parameter count, FLOPs
// per token, KV-cache bytes per token. Presets are the published architectures of the model layer's table
// (model/model_presets.h); `hybridflow plan --model DIR` reads a config.json into the same struct. The
// parameter count is the model layer's (model/model_size.h), so the planner and the engines agree on it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hybridflow/model/model_config.h"

namespace hybridflow::placement {

struct ModelShape {
  std::string name;
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t intermediate = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;  // hidden / heads unless the config says otherwise
  int64_t vocab = 0;
  bool tied_embeddings = false;
  bool qkv_bias = false;
  bool qk_norm = false;  // Qwen3's per-head q/k RMSNorm
  // config.json's model_type; empty: qwen2 with qkv_bias (no o_proj bias), else llama (o_proj bias with it).
  std::string model_type;
  MoeConfig moe;  // mixture-of-experts types: the experts of the sparse layers


  // The config these dimensions describe (the fields config.json has beyond them keep their defaults).
  ModelConfig model_config() const;

  // Parameters of one decoder layer on average: attention projections (and biases), the gated MLP or every
  // expert and router of a sparse one, two norms.
  double layer_parameters() const;
  // The whole model. A value head (critic, reward and cost models) replaces lm_head by a 1-output score.
  double parameters(bool value_head) const;
  // Those one token's forward uses: a mixture of experts' active count (parameters() for a dense model).
  double active_parameters(bool value_head) const;
  // Parameters that take part in matmuls per token (everything but the embedding lookup and the norms; of a
  // mixture of experts, the num_experts_per_tok experts a token goes through).
  double matmul_parameters(bool value_head) const;
  // Forward FLOPs for `tokens` tokens of sequences of `seq` tokens, causal attention computed only below
  // the diagonal (FlashAttention): 2 x matmul parameters per token + 2 x 2 x heads x head_dim x context
  // per layer, the average context of a causal sequence being seq / 2.
  double forward_flops(double tokens, double seq, bool value_head) const;
  // One decoding step of one sequence whose context is `context` tokens.
  double decode_flops(double context) const;
  // K and V of one token in every layer.
  double kv_bytes_per_token(double dtype_bytes) const;
  void validate() const;  // Error naming the first field that is not positive or not consistent
};

// The dimensions of a model config; `name` names it in messages.
ModelShape model_shape_of(const ModelConfig& config, const std::string& name);

// The published presets of model/model_presets.h: "qwen2.5-0.5b", "qwen3-0.6b", ..., "llama-7b", ...,
// "qwen2.5-72b".
std::vector<std::string> model_preset_names();
// Error naming the known presets for an unknown name.
ModelShape model_preset(const std::string& name);

}  // namespace hybridflow::placement
