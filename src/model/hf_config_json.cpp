// config.json <-> ModelConfig with the field names and defaults of transformers' LlamaConfig and
// Qwen2Config, so that directories move both ways between hybridflow and Hugging Face.
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
  HF_CHECK(c.model_type == "llama" || c.model_type == "qwen2", path, ": key 'model_type' must be \"llama\" or ",
           "\"qwen2\", got \"", c.model_type, "\"");
  const bool qwen2 = c.model_type == "qwen2";
  c.architecture = qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
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
  r.optional_double("rope_theta", c.rope_theta);
  // transformers >= 5 writes rope_theta inside rope_parameters (and reads it from there first).
  if (const json* rope = r.find("rope_parameters"); rope && !rope->is_null()) {
    HF_CHECK(rope->is_object(), path, ": key 'rope_parameters' must be an object, got ", rope->dump());
    for (const auto& [key, value] : rope->items())
      HF_CHECK(!value.is_object(), path, ": key 'rope_parameters' nests per-layer-type entries ('", key,
               "'), which this decoder does not support");
    const std::string type = rope->contains("rope_type") ? r.string((*rope)["rope_type"], "rope_parameters.rope_type")
                             : rope->contains("type")    ? r.string((*rope)["type"], "rope_parameters.type")
                                                         : "default";
    HF_CHECK(type == "default", path, ": key 'rope_parameters' has rope_type \"", type,
             "\"; only \"default\" (unscaled RoPE) is supported");
    if (rope->contains("partial_rotary_factor"))
      HF_CHECK((*rope)["partial_rotary_factor"] == 1.0, path,
               ": key 'rope_parameters.partial_rotary_factor' must be 1, got ", (*rope)["partial_rotary_factor"].dump());
    ConfigReader(*rope, path).optional_double("rope_theta", c.rope_theta);
  }
  r.optional_double("rms_norm_eps", c.rms_norm_eps);
  r.optional_bool("tie_word_embeddings", c.tie_word_embeddings);
  // Qwen2's q/k/v always carry a bias and its config has no such key; Llama's is configurable.
  c.attention_bias = qwen2;
  if (!qwen2) r.optional_bool("attention_bias", c.attention_bias);
  r.optional_token_id("bos_token_id", c.bos_token_id);
  r.optional_token_id("eos_token_id", c.eos_token_id);
  r.optional_token_id("pad_token_id", c.pad_token_id);
  if (const json* dt = r.find("torch_dtype"); dt && !dt->is_null()) c.torch_dtype = r.string(*dt, "torch_dtype");
  // transformers >= 5 renamed torch_dtype to dtype.
  else if (const json* dt5 = r.find("dtype"); dt5 && !dt5->is_null()) c.torch_dtype = r.string(*dt5, "dtype");
  // Features this decoder does not implement must not load silently as something else.
  if (const json* act = r.find("hidden_act"))
    HF_CHECK(r.string(*act, "hidden_act") == "silu", path, ": key 'hidden_act' must be \"silu\", got ", act->dump());
  if (const json* scaling = r.find("rope_scaling"))
    HF_CHECK(scaling->is_null(), path, ": key 'rope_scaling' is not supported (must be null), got ", scaling->dump());
  if (const json* mlp_bias = r.find("mlp_bias"))
    HF_CHECK(*mlp_bias == false, path, ": key 'mlp_bias' must be false (the MLP has no biases), got ",
             mlp_bias->dump());
  if (const json* types = r.find("layer_types"); types && !types->is_null()) {
    HF_CHECK(types->is_array(), path, ": key 'layer_types' must be a list, got ", types->dump());
    for (const auto& t : *types)
      HF_CHECK(t == "full_attention", path, ": key 'layer_types' lists ", t.dump(),
               "; only \"full_attention\" is supported (no sliding-window attention)");
  } else if (const json* sliding = r.find("use_sliding_window"); sliding && *sliding == true) {
    // Qwen2 without layer_types: layers from max_window_layers on use the window.
    int64_t max_window_layers = 28;
    r.optional_int("max_window_layers", max_window_layers);
    const json* window = r.find("sliding_window");
    HF_CHECK(window == nullptr || window->is_null() || max_window_layers >= c.num_hidden_layers, path,
             ": keys 'use_sliding_window' / 'max_window_layers' put layers ", max_window_layers,
             " and above under sliding-window attention, which is not supported");
  }
  if (const json* hd = r.find("head_dim"); hd && !hd->is_null())
    HF_CHECK(r.integer(*hd, "head_dim") * c.num_attention_heads == c.hidden_size, path, ": key 'head_dim' (",
             hd->dump(), ") must equal hidden_size / num_attention_heads");
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
  if (c.model_type != "qwen2") doc["attention_bias"] = c.attention_bias;
  auto token = [](int64_t id) { return id >= 0 ? json(id) : json(nullptr); };
  doc["bos_token_id"] = token(c.bos_token_id);
  doc["eos_token_id"] = token(c.eos_token_id);
  doc["pad_token_id"] = token(c.pad_token_id);
  write_file_atomic(path, doc.dump(2) + "\n");
}

}  // namespace hybridflow
