// config.json <-> ModelConfig with the field names and defaults of transformers' LlamaConfig,
// MistralConfig, Qwen2Config and Qwen3Config, so that directories move both ways between hybridflow and
// Hugging Face.
#include <nlohmann/json.hpp>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/model/pretrained.h"

namespace hybridflow {
namespace {

using json = nlohmann::json;

class ConfigReader {
 public:
  ConfigReader(const json& doc, const std::string& path) : doc_(doc), path_(path) {}

  const json* find(const char* key) const {
    auto it = doc_.find(key);
    return it == doc_.end() ? nullptr : &*it;
  }
  const json& require(const char* key) const {
    const json* v = find(key);
    HF_CHECK(v != nullptr, path_, ": missing required key '", key, "'");
    return *v;
  }
  int64_t integer(const json& v, const char* key) const {
    HF_CHECK(v.is_number_integer(), path_, ": key '", key, "' must be an integer, got ", v.dump());
    return v.get<int64_t>();
  }
  int64_t required_int(const char* key) const { return integer(require(key), key); }
  void optional_int(const char* key, int64_t& out) const {
    if (const json* v = find(key)) out = integer(*v, key);
  }
  void optional_double(const char* key, double& out) const {
    if (const json* v = find(key)) {
      HF_CHECK(v->is_number(), path_, ": key '", key, "' must be a number, got ", v->dump());
      out = v->get<double>();
    }
  }
  void optional_bool(const char* key, bool& out) const {
    if (const json* v = find(key)) {
      HF_CHECK(v->is_boolean(), path_, ": key '", key, "' must be true or false, got ", v->dump());
      out = v->get<bool>();
    }
  }
  std::string string(const json& v, const char* key) const {
    HF_CHECK(v.is_string(), path_, ": key '", key, "' must be a string, got ", v.dump());
    return v.get<std::string>();
  }
  // Token ids may be null (none) or, as in Llama 3, a list of which the first is the primary one.
  void optional_token_id(const char* key, int64_t& out) const {
    const json* v = find(key);
    if (v == nullptr || v->is_null()) return;
    if (v->is_array()) {
      HF_CHECK(!v->empty(), path_, ": key '", key, "' is an empty list");
      out = integer((*v)[0], key);
      return;
    }
    out = integer(*v, key);
  }

 private:
  const json& doc_;
  const std::string& path_;
};

double number(const json& v, const std::string& path, const std::string& key) {
  HF_CHECK(v.is_number(), path, ": key '", key, "' must be a number, got ", v.dump());
  return v.get<double>();
}

// RoPE settings as transformers 5 standardises them: rope_parameters (5.x) or the older rope_scaling, which
// wins when both are present; a partial rotary factor and per-layer-type entries are refused.
void read_rope(const json& doc, const std::string& path, ModelConfig& c) {
  const json* params = nullptr;
  std::string key;
  for (const char* candidate : {"rope_parameters", "rope_scaling"}) {
    auto it = doc.find(candidate);
    if (it != doc.end() && !it->is_null()) {
      params = &*it;
      key = candidate;
    }
  }
  if (params == nullptr) return;
  HF_CHECK(params->is_object(), path, ": key '", key, "' must be an object, got ", params->dump());
  for (const auto& [name, value] : params->items())
    HF_CHECK(!value.is_object(), path, ": key '", key, "' nests per-layer-type entries ('", name,
             "'), which this decoder does not support");
  auto field = [&](const char* name) -> const json* {
    auto it = params->find(name);
    return it == params->end() || it->is_null() ? nullptr : &*it;
  };
  auto full = [&](const char* name) { return key + "." + name; };
  RopeScaling& r = c.rope_scaling;
  if (const json* type = field("rope_type") ? field("rope_type") : field("type")) {
    HF_CHECK(type->is_string(), path, ": key '", full("rope_type"), "' must be a string, got ", type->dump());
    r.type = type->get<std::string>();
  }
  HF_CHECK(is_supported_rope_type(r.type), path, ": key '", full("rope_type"), "' is \"", r.type, "\"; supported: ",
           supported_rope_types(), " (longrope and others are not implemented)");
  if (const json* theta = field("rope_theta")) c.rope_theta = number(*theta, path, full("rope_theta"));
  if (const json* partial = field("partial_rotary_factor"))
    HF_CHECK(number(*partial, path, full("partial_rotary_factor")) == 1.0, path, ": key '",
             full("partial_rotary_factor"), "' must be 1 (every channel rotated), got ", partial->dump());
  if (!r.scaled()) return;
  auto optional = [&](const char* name, double& out) {
    if (const json* v = field(name)) out = number(*v, path, full(name));
  };
  auto required = [&](const char* name, double& out) {
    HF_CHECK(field(name) != nullptr, path, ": key '", key, "' of rope_type \"", r.type, "\" needs '", name, "'");
    optional(name, out);
  };
  // transformers: a top-level original_max_position_embeddings (Phi-3 style) wins over the nested one.
  double original = 0;
  optional("original_max_position_embeddings", original);
  if (auto it = doc.find("original_max_position_embeddings"); it != doc.end() && !it->is_null())
    original = number(*it, path, "original_max_position_embeddings");
  r.original_max_position_embeddings = static_cast<int64_t>(original);
  if (r.type == "yarn") {
    // A yarn factor may be left out: it is then max_position_embeddings / original_max_position_embeddings.
    r.factor = 0;
    optional("factor", r.factor);
    double attention = 0;
    if (field("attention_factor")) {
      optional("attention_factor", attention);
      r.attention_factor = attention;
    }
    optional("beta_fast", r.beta_fast);
    optional("beta_slow", r.beta_slow);
    optional("mscale", r.mscale);
    optional("mscale_all_dim", r.mscale_all_dim);
    if (const json* truncate = field("truncate")) {
      HF_CHECK(truncate->is_boolean(), path, ": key '", full("truncate"), "' must be true or false, got ",
               truncate->dump());
      r.truncate = truncate->get<bool>();
    }
    return;
  }
  required("factor", r.factor);
  if (r.type == "llama3") {
    required("low_freq_factor", r.low_freq_factor);
    required("high_freq_factor", r.high_freq_factor);
  }
}

// The mixture-of-experts keys of Qwen2MoeConfig, Qwen3MoeConfig and MixtralConfig. The expert count and width
// are required (transformers' defaults, 60 or 128 experts, are no model anyone saved without them).
void read_moe(const ConfigReader& r, const std::string& path, ModelConfig& c) {
  MoeConfig& m = c.moe;
  const bool mixtral = c.model_type == "mixtral";
  // MixtralConfig maps num_experts to num_local_experts and Qwen3MoeConfig the other way; each saves either.
  const json* experts = r.find(mixtral ? "num_local_experts" : "num_experts");
  const char* experts_key = mixtral ? "num_local_experts" : "num_experts";
  if (experts == nullptr) {
    experts = r.find(mixtral ? "num_experts" : "num_local_experts");
    if (experts != nullptr) experts_key = mixtral ? "num_experts" : "num_local_experts";
  }
  HF_CHECK(experts != nullptr, path, ": missing required key '", mixtral ? "num_local_experts" : "num_experts",
           "' (model_type ", c.model_type, ")");
  m.num_experts = r.integer(*experts, experts_key);
  m.num_experts_per_tok = r.required_int("num_experts_per_tok");
  if (!mixtral) {
    m.moe_intermediate_size = r.required_int("moe_intermediate_size");
    r.optional_bool("norm_topk_prob", m.norm_topk_prob);
    r.optional_int("decoder_sparse_step", m.decoder_sparse_step);
    if (const json* dense = r.find("mlp_only_layers"); dense && !dense->is_null()) {
      HF_CHECK(dense->is_array(), path, ": key 'mlp_only_layers' must be a list of layer indices, got ", dense->dump());
      for (const auto& layer : *dense) m.mlp_only_layers.push_back(r.integer(layer, "mlp_only_layers"));
    }
  } else {
    m.norm_topk_prob = true;  // MixtralTopKRouter always renormalises
    double jitter = 0;
    r.optional_double("router_jitter_noise", jitter);
    HF_CHECK(jitter == 0, path, ": key 'router_jitter_noise' must be 0 (training-time router noise is not "
             "implemented), got ", jitter);
  }
  if (c.model_type == "qwen2_moe") m.shared_expert_intermediate_size = r.required_int("shared_expert_intermediate_size");
  r.optional_double("router_aux_loss_coef", m.router_aux_loss_coef);
  r.optional_bool("output_router_logits", m.output_router_logits);
}

}  // namespace

ModelConfig load_model_config(const std::string& path) {
  json doc;
  try {
    doc = json::parse(read_file(path));
  } catch (const json::exception& e) {
    HF_FAIL(path, ": not valid JSON: ", e.what());
  }
  HF_CHECK(doc.is_object(), path, ": config.json must be a JSON object");
  ConfigReader r(doc, path);
  ModelConfig c;
  c.model_type = r.string(r.require("model_type"), "model_type");
  HF_CHECK(is_supported_model_type(c.model_type), path, ": key 'model_type' must be one of ", supported_model_types(),
           ", got \"", c.model_type, "\"");
  const bool qwen2 = c.model_type == "qwen2";
  const bool mistral = c.model_type == "mistral" || c.model_type == "mixtral";  // same attention and window keys
  c.architecture = causal_lm_architecture(c.model_type);
  if (const json* arch = r.find("architectures")) {
    HF_CHECK(arch->is_array() && arch->size() == 1, path, ": key 'architectures' must be a list of one name, got ",
             arch->dump());
    c.architecture = r.string((*arch)[0], "architectures");
  }
  c.vocab_size = r.required_int("vocab_size");
  c.hidden_size = r.required_int("hidden_size");
  c.intermediate_size = r.required_int("intermediate_size");
  c.num_hidden_layers = r.required_int("num_hidden_layers");
  c.num_attention_heads = r.required_int("num_attention_heads");
  // transformers: num_key_value_heads = None means multi-head attention.
  c.num_key_value_heads = c.num_attention_heads;
  if (const json* kv = r.find("num_key_value_heads"); kv && !kv->is_null())
    c.num_key_value_heads = r.integer(*kv, "num_key_value_heads");
  r.optional_int("max_position_embeddings", c.max_position_embeddings);
  if (c.model_type == "mixtral") c.rope_theta = 1e6;  // MixtralConfig.default_theta
  r.optional_double("rope_theta", c.rope_theta);
  read_rope(doc, path, c);
  r.optional_double("rms_norm_eps", c.rms_norm_eps);
  r.optional_bool("tie_word_embeddings", c.tie_word_embeddings);
  // Qwen2's q/k/v always carry a bias and Mistral's never, whatever the config says (transformers builds
  // them so); Llama's and Qwen3's follow attention_bias.
  c.attention_bias = qwen2;
  if (c.model_type == "qwen2_moe") {
    c.attention_bias = true;  // Qwen2MoeConfig.qkv_bias
    r.optional_bool("qkv_bias", c.attention_bias);
  } else if (!qwen2 && !mistral) {
    r.optional_bool("attention_bias", c.attention_bias);
  }
  r.optional_token_id("bos_token_id", c.bos_token_id);
  r.optional_token_id("eos_token_id", c.eos_token_id);
  r.optional_token_id("pad_token_id", c.pad_token_id);
  if (const json* dt = r.find("torch_dtype"); dt && !dt->is_null()) c.torch_dtype = r.string(*dt, "torch_dtype");
  // transformers >= 5 renamed torch_dtype to dtype.
  else if (const json* dt5 = r.find("dtype"); dt5 && !dt5->is_null()) c.torch_dtype = r.string(*dt5, "dtype");
  // Features this decoder does not implement must not load silently as something else.
  if (const json* act = r.find("hidden_act"))
    HF_CHECK(r.string(*act, "hidden_act") == "silu", path, ": key 'hidden_act' must be \"silu\", got ", act->dump());
  if (const json* mlp_bias = r.find("mlp_bias"))
    HF_CHECK(*mlp_bias == false, path, ": key 'mlp_bias' must be false (the MLP has no biases), got ",
             mlp_bias->dump());
  if (mistral) {
    // MistralConfig's default window is 4096: a config without the key has one; null means none. Mixtral's
    // default is none.
    c.sliding_window = c.model_type == "mistral" ? 4096 : 0;
    if (const json* window = r.find("sliding_window")) c.sliding_window = window->is_null() ? 0 : r.integer(*window, "sliding_window");
    HF_CHECK(c.sliding_window >= 0, path, ": key 'sliding_window' must be >= 1 or null, got ", c.sliding_window);
  } else if (const json* types = r.find("layer_types"); types && !types->is_null()) {
    HF_CHECK(types->is_array(), path, ": key 'layer_types' must be a list, got ", types->dump());
    for (const auto& t : *types)
      HF_CHECK(t == "full_attention", path, ": key 'layer_types' lists ", t.dump(),
               "; only \"full_attention\" is supported (no sliding-window attention)");
  } else if (const json* sliding = r.find("use_sliding_window"); sliding && *sliding == true) {
    HF_CHECK(c.model_type != "qwen3_moe", path, ": key 'use_sliding_window' is true, which puts every layer under ",
             "sliding-window attention; not supported for qwen3_moe");
    // Qwen2 without layer_types: layers from max_window_layers on use the window.
    int64_t max_window_layers = 28;
    r.optional_int("max_window_layers", max_window_layers);
    const json* window = r.find("sliding_window");
    HF_CHECK(window == nullptr || window->is_null() || max_window_layers >= c.num_hidden_layers, path,
             ": keys 'use_sliding_window' / 'max_window_layers' put layers ", max_window_layers,
             " and above under sliding-window attention, which is not supported");
  }
  // Qwen3Config's head_dim defaults to 128; the others' to hidden_size / num_attention_heads.
  if (c.model_type == "qwen3") c.explicit_head_dim = 128;
  if (const json* hd = r.find("head_dim"); hd && !hd->is_null()) {
    c.explicit_head_dim = r.integer(*hd, "head_dim");
    HF_CHECK(c.explicit_head_dim > 0, path, ": key 'head_dim' must be > 0, got ", hd->dump());
  }
  RopeScaling& rope = c.rope_scaling;
  if (rope.type == "llama3" || rope.type == "yarn") {
    if (rope.original_max_position_embeddings == 0) rope.original_max_position_embeddings = c.max_position_embeddings;
    if (rope.type == "yarn" && rope.factor == 0)
      rope.factor = static_cast<double>(c.max_position_embeddings) / rope.original_max_position_embeddings;
  }
  if (c.is_moe_type()) read_moe(r, path, c);
  try {
    c.validate();
  } catch (const Error& e) {
    HF_FAIL(path, ": ", e.what());
  }
  return c;
}

void save_model_config(const ModelConfig& c, const std::string& path) {
  c.validate();
  HF_CHECK(c.model_type != "qwen2" || c.attention_bias, path,
           ": a qwen2 model always has q/k/v bias in Hugging Face; attention_bias=false cannot be saved as qwen2");
  json doc = {
      {"architectures", {c.architecture}},
      {"model_type", c.model_type},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"max_position_embeddings", c.max_position_embeddings},
      {"rope_theta", c.rope_theta},
      {"rms_norm_eps", c.rms_norm_eps},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"hidden_act", "silu"},
      {"torch_dtype", c.torch_dtype},
      {"use_cache", true},
  };
  if (c.model_type == "llama" || c.model_type == "qwen3" || c.model_type == "qwen3_moe")
    doc["attention_bias"] = c.attention_bias;
  if (c.model_type == "qwen2_moe") doc["qkv_bias"] = c.attention_bias;
  HF_CHECK(c.model_type != "mistral" || !c.attention_bias, path,
           ": a mistral model has no attention biases in Hugging Face; attention_bias=true cannot be saved as mistral");
  doc["head_dim"] = c.head_dim();
  if (c.model_type == "mistral" || c.model_type == "mixtral")
    doc["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  if (c.model_type == "qwen2" || c.model_type == "qwen3" || c.model_type == "qwen2_moe" || c.model_type == "qwen3_moe")
    doc["use_sliding_window"] = false;
  if (c.is_moe_type()) {
    const MoeConfig& m = c.moe;
    doc[c.model_type == "mixtral" ? "num_local_experts" : "num_experts"] = m.num_experts;
    doc["num_experts_per_tok"] = m.num_experts_per_tok;
    doc["router_aux_loss_coef"] = m.router_aux_loss_coef;
    doc["output_router_logits"] = m.output_router_logits;
    if (c.model_type != "mixtral") {
      doc["moe_intermediate_size"] = m.moe_intermediate_size;
      doc["norm_topk_prob"] = m.norm_topk_prob;
      doc["decoder_sparse_step"] = m.decoder_sparse_step;
      doc["mlp_only_layers"] = m.mlp_only_layers;
    }
    if (c.model_type == "qwen2_moe") doc["shared_expert_intermediate_size"] = m.shared_expert_intermediate_size;
  }
  // rope_scaling with rope_type is what both transformers 4 and 5 read (5 moves it into rope_parameters).
  const RopeScaling& rope = c.rope_scaling;
  if (rope.scaled()) {
    json scaling = {{"rope_type", rope.type}, {"factor", rope.factor}};
    if (rope.type == "llama3" || rope.type == "yarn")
      scaling["original_max_position_embeddings"] = rope.original_max_position_embeddings > 0
                                                        ? rope.original_max_position_embeddings
                                                        : c.max_position_embeddings;
    if (rope.type == "llama3") {
      scaling["low_freq_factor"] = rope.low_freq_factor;
      scaling["high_freq_factor"] = rope.high_freq_factor;
    }
    if (rope.type == "yarn") {
      scaling["beta_fast"] = rope.beta_fast;
      scaling["beta_slow"] = rope.beta_slow;
      if (rope.attention_factor) scaling["attention_factor"] = *rope.attention_factor;
      if (rope.mscale != 0) scaling["mscale"] = rope.mscale;
      if (rope.mscale_all_dim != 0) scaling["mscale_all_dim"] = rope.mscale_all_dim;
      scaling["truncate"] = rope.truncate;
    }
    doc["rope_scaling"] = scaling;
  }
  auto token = [](int64_t id) { return id >= 0 ? json(id) : json(nullptr); };
  doc["bos_token_id"] = token(c.bos_token_id);
  doc["eos_token_id"] = token(c.eos_token_id);
  doc["pad_token_id"] = token(c.pad_token_id);
  write_file_atomic(path, doc.dump(2) + "\n");
}

}  // namespace hybridflow
