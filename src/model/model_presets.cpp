// The preset table (model_presets.h). Published numbers are those of each model's config.json on the
// Hugging Face hub (the repository named in `source`); parameter counts they imply are checked against the
// published totals in tests/model/test_model_presets.cpp.
#include "hybridflow/model/model_presets.h"

#include "hybridflow/core/error.h"

namespace hybridflow {
namespace {

struct PresetDims {
  int64_t hidden, intermediate, layers, heads, kv_heads, vocab, max_positions;
};

ModelConfig preset_dims_config(const std::string& model_type, const PresetDims& d) {
  ModelConfig c;
  c.model_type = model_type;
  c.architecture = causal_lm_architecture(model_type);
  c.hidden_size = d.hidden;
  c.intermediate_size = d.intermediate;
  c.num_hidden_layers = d.layers;
  c.num_attention_heads = d.heads;
  c.num_key_value_heads = d.kv_heads;
  c.vocab_size = d.vocab;
  c.max_position_embeddings = d.max_positions;
  return c;
}

// A test shape: the tokenizer gives its vocabulary.
ModelPreset test_preset(const std::string& name, const std::string& what, const std::string& model_type,
                        const PresetDims& d) {
  return {name, what, false, preset_dims_config(model_type, d)};
}

// Qwen3: q/k head norms, head_dim 128 whatever the width, no biases, rope_theta 1e6, bos 151643, eos 151645.
ModelPreset qwen3_preset(const std::string& name, const std::string& repo, const PresetDims& d, bool tied) {
  ModelConfig c = preset_dims_config("qwen3", d);
  c.explicit_head_dim = 128;
  c.rope_theta = 1e6;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = tied;
  c.bos_token_id = 151643;
  c.eos_token_id = 151645;
  c.torch_dtype = "bfloat16";
  return {name, repo + " config.json", true, c};
}

// Qwen3-MoE: Qwen3's attention (head_dim 128, q/k norms) and every layer's MLP a router over 128 experts of
// width 768, 8 per token with renormalised weights; untied, rope_theta 1e6, bos 151643, eos 151645.
ModelPreset qwen3_moe_preset(const std::string& name, const std::string& repo, const PresetDims& d, int64_t experts,
                             int64_t per_token, int64_t width) {
  ModelPreset p = qwen3_preset(name, repo, d, /*tied=*/false);
  p.config.model_type = "qwen3_moe";
  p.config.architecture = causal_lm_architecture("qwen3_moe");
  p.config.moe.num_experts = experts;
  p.config.moe.num_experts_per_tok = per_token;
  p.config.moe.moe_intermediate_size = width;
  p.config.moe.norm_topk_prob = true;
  return p;
}

// Qwen2.5: q/k/v biases (no o_proj bias), rope_theta 1e6; the base models' bos = eos = 151643.
ModelPreset qwen25_preset(const std::string& name, const std::string& repo, const PresetDims& d, bool tied,
                          double rms_norm_eps) {
  ModelConfig c = preset_dims_config("qwen2", d);
  c.attention_bias = true;
  c.rope_theta = 1e6;
  c.rms_norm_eps = rms_norm_eps;
  c.tie_word_embeddings = tied;
  c.bos_token_id = 151643;
  c.eos_token_id = 151643;
  c.torch_dtype = "bfloat16";
  return {name, repo + " config.json", true, c};
}

// Llama 2 (and Code Llama 34B, the family's 34B): vocabulary 32000, rms_norm_eps 1e-5, bos 1, eos 2.
ModelPreset llama2_preset(const std::string& name, const std::string& repo, const PresetDims& d, double rope_theta) {
  ModelConfig c = preset_dims_config("llama", d);
  c.rope_theta = rope_theta;
  c.rms_norm_eps = 1e-5;
  c.bos_token_id = 1;
  c.eos_token_id = 2;
  c.torch_dtype = "float16";
  return {name, repo + " config.json", true, c};
}

// Llama 3.2 1B: tied embeddings, head_dim 64, rope_theta 5e5 with llama3 frequency scaling (factor 32 over
// an 8192-token pretraining context), bos 128000, eos 128001.
ModelPreset llama32_1b_preset() {
  ModelConfig c = preset_dims_config("llama", {2048, 8192, 16, 32, 8, 128256, 131072});
  c.explicit_head_dim = 64;
  c.rope_theta = 500000.0;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = true;
  c.rope_scaling.type = "llama3";
  c.rope_scaling.factor = 32.0;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 8192;
  c.bos_token_id = 128000;
  c.eos_token_id = 128001;
  c.torch_dtype = "bfloat16";
  return {"llama3.2-1b", "meta-llama/Llama-3.2-1B config.json", true, c};
}

std::vector<ModelPreset> build_model_presets() {
  std::vector<ModelPreset> out;
  const PresetDims tiny{128, 344, 4, 4, 2, 0, 256};
  out.push_back(test_preset("tiny", "tests: seconds on a laptop", "llama", tiny));
  ModelPreset qwen2_tiny = test_preset("qwen2-tiny", "tests: the Qwen2 layout (q/k/v biases, tied embeddings)",
                                       "qwen2", tiny);
  qwen2_tiny.config.attention_bias = true;
  qwen2_tiny.config.tie_word_embeddings = true;
  out.push_back(qwen2_tiny);
  // Heads wider than hidden_size / heads, as Qwen3's fixed head_dim of 128 makes them in the small models.
  ModelPreset qwen3_tiny = test_preset("qwen3-tiny", "tests: the Qwen3 layout (q/k norms, explicit head_dim)",
                                       "qwen3", tiny);
  qwen3_tiny.config.explicit_head_dim = 48;
  out.push_back(qwen3_tiny);
  // Qwen3-MoE's layout at test size: 8 experts, 2 per token, every other layer sparse.
  ModelPreset qwen3_moe_tiny = test_preset("qwen3-moe-tiny", "tests: the Qwen3-MoE layout (experts, top-2 routing)",
                                           "qwen3_moe", tiny);
  qwen3_moe_tiny.config.explicit_head_dim = 48;
  MoeConfig& tiny_moe = qwen3_moe_tiny.config.moe;
  tiny_moe.num_experts = 8;
  tiny_moe.num_experts_per_tok = 2;
  tiny_moe.moe_intermediate_size = 96;
  tiny_moe.norm_topk_prob = true;
  tiny_moe.decoder_sparse_step = 2;
  out.push_back(qwen3_moe_tiny);
  ModelPreset mistral_tiny = test_preset("mistral-tiny", "tests: Mistral's sliding window", "mistral", tiny);
  mistral_tiny.config.sliding_window = 64;
  out.push_back(mistral_tiny);
  out.push_back(test_preset("small", "examples: minutes on a laptop", "llama", {256, 688, 4, 8, 4, 0, 1024}));
  out.push_back(test_preset("base", "examples: the largest test shape", "llama", {512, 1376, 8, 8, 4, 0, 2048}));

  // Published architectures, small to large: {hidden, intermediate, layers, heads, kv heads, vocab, context}.
  out.push_back(qwen25_preset("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B", {896, 4864, 24, 14, 2, 151936, 32768}, true, 1e-6));
  out.push_back(qwen3_preset("qwen3-0.6b", "Qwen/Qwen3-0.6B", {1024, 3072, 28, 16, 8, 151936, 40960}, true));
  out.push_back(llama32_1b_preset());
  out.push_back(qwen3_preset("qwen3-1.7b", "Qwen/Qwen3-1.7B", {2048, 6144, 28, 16, 8, 151936, 40960}, true));
  out.push_back(qwen3_preset("qwen3-4b", "Qwen/Qwen3-4B", {2560, 9728, 36, 32, 8, 151936, 40960}, true));
  out.push_back(llama2_preset("llama-7b", "meta-llama/Llama-2-7b-hf", {4096, 11008, 32, 32, 32, 32000, 4096}, 1e4));
  out.push_back(
      qwen25_preset("qwen2.5-7b", "Qwen/Qwen2.5-7B", {3584, 18944, 28, 28, 4, 152064, 131072}, false, 1e-6));
  out.push_back(llama2_preset("llama-13b", "meta-llama/Llama-2-13b-hf", {5120, 13824, 40, 40, 40, 32000, 4096}, 1e4));
  out.push_back(qwen3_moe_preset("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", {2048, 6144, 48, 32, 4, 151936, 40960},
                                 /*experts=*/128, /*per_token=*/8, /*width=*/768));
  out.push_back(
      qwen25_preset("qwen2.5-32b", "Qwen/Qwen2.5-32B", {5120, 27648, 64, 40, 8, 152064, 131072}, false, 1e-5));
  out.push_back(
      llama2_preset("llama-34b", "codellama/CodeLlama-34b-hf", {8192, 22016, 48, 64, 8, 32000, 16384}, 1e6));
  out.push_back(llama2_preset("llama-70b", "meta-llama/Llama-2-70b-hf", {8192, 28672, 80, 64, 8, 32000, 4096}, 1e4));
  out.push_back(
      qwen25_preset("qwen2.5-72b", "Qwen/Qwen2.5-72B", {8192, 29568, 80, 64, 8, 152064, 131072}, false, 1e-5));
  return out;
}

}  // namespace

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = build_model_presets();
  return presets;
}

std::string model_preset_list(bool published_only) {
  std::string out;
  for (const ModelPreset& p : model_presets())
    if (p.published || !published_only) out += (out.empty() ? "" : ", ") + p.name;
  return out;
}

std::optional<ModelPreset> find_model_preset(const std::string& name) {
  for (const ModelPreset& p : model_presets())
    if (p.name == name) return p;
  return std::nullopt;
}

ModelConfig preset_model_config(const std::string& name, int64_t vocab_size) {
  const std::optional<ModelPreset> preset = find_model_preset(name);
  HF_CHECK(preset.has_value(), "unknown model preset '", name, "'; expected one of: ", model_preset_list());
  ModelConfig config = preset->config;
  if (preset->published) {
    // The published embedding is kept (Qwen pads its vocabulary past the tokenizer's); the tokenizer's ids
    // must fit in it.
    HF_CHECK(vocab_size <= config.vocab_size, "model preset '", name, "' has a vocabulary of ", config.vocab_size,
             " rows (", preset->source, ") but the tokenizer has ", vocab_size, " tokens; use a tokenizer of that ",
             "family (Qwen's for qwen*, Llama 3's for llama3.2-1b)");
  } else {
    config.vocab_size = vocab_size;
  }
  config.validate();
  return config;
}

}  // namespace hybridflow
