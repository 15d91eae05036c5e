#include "hybridflow/workers/model_spec.h"

#include "hybridflow/core/error.h"
#include "hybridflow/model/model_config.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/runtime/worker.h"

namespace hybridflow {

namespace {
void override_dim(const nlohmann::json& spec, const char* key, int64_t& field) {
  const int64_t v = spec.value(key, int64_t{0});
  if (v > 0) field = v;
}
}  // namespace

CausalLM build_model(const nlohmann::json& spec, HeadKind head) {
  // Same seed on every rank, for actor and reference, and in every run: identical initial weights,
  // including a value head that a language model directory does not have and so starts fresh.
  torch::manual_seed(spec.value("init_seed", uint64_t{0}));
  const torch::Device device = model_device(spec);
  const torch::Dtype dtype = parse_dtype(spec.value("dtype", std::string("fp32")), "model dtype");
  const std::string path = spec.value("path", std::string());
  if (!path.empty()) {
    CausalLM model = load_pretrained(path, head).model;
    model->to(device, dtype);
    return model;
  }
  HF_CHECK(spec.contains("vocab_size"), "model spec: 'vocab_size' is required without 'path', got ", spec.dump());
  ModelConfig config = preset_model_config(spec.value("preset", std::string("tiny")), spec.at("vocab_size").get<int64_t>());
  override_dim(spec, "hidden_size", config.hidden_size);
  override_dim(spec, "num_hidden_layers", config.num_hidden_layers);
  override_dim(spec, "intermediate_size", config.intermediate_size);
  override_dim(spec, "num_attention_heads", config.num_attention_heads);
  override_dim(spec, "num_key_value_heads", config.num_key_value_heads);
  config.eos_token_id = spec.value("eos_token_id", config.eos_token_id);
  config.pad_token_id = spec.value("pad_token_id", config.pad_token_id);
  config.validate();
  CausalLM model(config, head);
  // Initialised in fp32 on the CPU, then moved and cast: the same weights whatever the device and dtype.
  model->to(device, dtype);
  return model;
}

torch::Device model_device(const nlohmann::json& spec) { return worker_device(spec.value("device", std::string("cpu"))); }

double parameter_sq_norm(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  double total = 0;
  for (const auto& p : module.parameters()) total += p.detach().to(torch::kDouble).pow(2).sum().item<double>();
  return total;
}

}  // namespace hybridflow
