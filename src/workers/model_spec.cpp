#include "hybridflow/workers/model_spec.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <map>

#include "hybridflow/core/error.h"
#include "hybridflow/core/platform.h"
#include "hybridflow/model/lora_setup.h"
#include "hybridflow/model/model_config.h"
#include "hybridflow/model/pipeline_layout.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/model/tensor_parallel_layout.h"
#include "hybridflow/workers/expert_parallel_ranks.h"
#include "hybridflow/runtime/worker.h"

namespace hybridflow {

namespace {
void override_dim(int64_t spec_value, int64_t& field) {
  if (spec_value > 0) field = spec_value;
}

// A value head the checkpoint did not have, drawn from its own generator: the constructor's draw depends on
// how much of the random stream the (split) model before it took, so it would differ between layouts.
void init_value_head(CausalLM& model, uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(seed ^ 0x5c0e5c0e5c0eULL);
  torch::Tensor w = model->named_parameters()["score.weight"];
  const double bound = 1.0 / std::sqrt(static_cast<double>(w.size(1)));  // torch.nn.Linear's default range
  w.copy_(at::empty(w.sizes(), torch::kFloat).uniform_(-bound, bound, gen));
}
}  // namespace

ModelConfig model_config_of(const ModelSpec& spec) {
  if (!spec.path.empty()) return load_model_config(spec.path + "/config.json");
  HF_CHECK(spec.vocab_size > 0, "model spec: 'vocab_size' is required without 'path', got ", nlohmann::json(spec).dump());
  ModelConfig config = preset_model_config(spec.preset, spec.vocab_size);
  override_dim(spec.hidden_size, config.hidden_size);
  override_dim(spec.num_hidden_layers, config.num_hidden_layers);
  override_dim(spec.intermediate_size, config.intermediate_size);
  override_dim(spec.num_attention_heads, config.num_attention_heads);
  override_dim(spec.num_key_value_heads, config.num_key_value_heads);
  config.eos_token_id = spec.eos_token_id.value_or(config.eos_token_id);
  config.pad_token_id = spec.pad_token_id.value_or(config.pad_token_id);
  config.validate();
  return config;
}

CausalLM build_model(const ModelSpec& spec, HeadKind head, const TensorParallelGroup& tp, const PipelineStage& stage) {
  // Same seed on every rank, for actor and reference, and in every run: identical initial weights,
  // including a value head that a language model directory does not have and so starts fresh.
  seed_cpu_generator(spec.init_seed);
  const torch::Device device = model_device(spec);
  const torch::Dtype dtype = parse_dtype(spec.dtype, "model dtype");
  if (!spec.path.empty()) {
    Pretrained loaded = load_pretrained(spec.path, head, torch::kFloat32, tp, stage);
    if (loaded.fresh_value_head && stage.last()) init_value_head(loaded.model, spec.init_seed);
    loaded.model->to(device, dtype);
    loaded.model->set_gradient_checkpointing(spec.enable_gradient_checkpointing);
    // Drawn from init_seed: every rank and role building this spec draws the same adapters.
    add_configured_lora(loaded.model, spec.lora, spec.lora_adapter_path, spec.init_seed, spec.lora_key);
    return loaded.model;
  }
  const ModelConfig config = model_config_of(spec);
  CausalLM model(config, head);
  if (tp.enabled() || stage.enabled()) {
    if (tp.enabled()) check_tensor_parallel(config, tp.size());
    CausalLM split(config, head, tp, stage);
    load_full_state(*split, [&] {
      std::map<std::string, torch::Tensor> full;
      for (const auto& item : model->named_parameters()) full[item.key()] = item.value().detach();
      return full;
    }());
    model = split;
  }
  // Initialised in fp32 on the CPU, then moved and cast: the same weights whatever the device and dtype.
  model->to(device, dtype);
  model->set_gradient_checkpointing(spec.enable_gradient_checkpointing);
  add_configured_lora(model, spec.lora, spec.lora_adapter_path, spec.init_seed, spec.lora_key);
  return model;
}

torch::Device model_device(const ModelSpec& spec) { return worker_device(spec.device); }

double parameter_sq_norm(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  double total = 0;
  for (const auto& p : module.parameters()) total += p.detach().to(torch::kDouble).pow(2).sum().item<double>();
  return total;
}

double parameter_sq_norm(const CausalLM& model, Communicator* stages) {
  const TensorParallelGroup& tp = model->tensor_parallel();
  const PipelineStage& stage = model->pipeline_stage();
  HF_CHECK(!stage.enabled() || (stages != nullptr && stages->size() == stage.stages), "parameter_sq_norm: the model ",
           "is pipeline stage ", stage.stage, " of ", stage.stages, " and needs the communicator over its stages");
  const ExpertParallelGroup& ep = model->expert_parallel();
  if (!tp.enabled() && !stage.enabled() && !ep.enabled()) return parameter_sq_norm(*model.ptr());
  torch::NoGradGuard no_grad;
  // [split over tp, replicated, experts of this rank], the first summed over tp, the last over the expert-parallel
  // group (each rank's experts are its own; whole on every tensor-parallel rank), then all over the stages.
  torch::Tensor squares = torch::zeros({3}, torch::kDouble);
  for (const auto& item : model->named_parameters()) {
    // The last stage's copy of a tied embedding is the first stage's weight.
    if (stage.enabled() && owning_stage(item.key(), model->config(), stage.stages) != stage.stage) continue;
    const double sq = item.value().detach().to(torch::kDouble).pow(2).sum().item<double>();
    const bool expert = ep.enabled() && is_expert_parameter_name(item.key());
    squares[expert ? 2 : shard_dim(item.key(), model->config(), tp.size()) == ShardDim::kReplicated ? 1 : 0] += sq;
  }
  const torch::Device device = model->parameters().front().device();
  torch::Tensor split = squares.narrow(0, 0, 1).to(device);
  if (tp.enabled()) tp.comm()->all_reduce(split);
  torch::Tensor experts = squares.narrow(0, 2, 1).to(device);
  if (ep.enabled()) ep.comm()->all_reduce(experts);
  torch::Tensor total = split + squares.narrow(0, 1, 1).to(device) + experts;
  if (stage.enabled()) stages->all_reduce(total);
  return total.item<double>();
}

}  // namespace hybridflow
