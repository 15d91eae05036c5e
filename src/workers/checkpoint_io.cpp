#include "hybridflow/workers/checkpoint_io.h"

#include <ATen/CPUGeneratorImpl.h>

#include <map>
#include <mutex>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/logging.h"
#include "hybridflow/model/lora.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/model/safetensors.h"
#include "hybridflow/model/tensor_parallel_layout.h"
#include "hybridflow/model/tokenizer.h"
#include "hybridflow/parallel/gather_named.h"
#include "hybridflow/workers/expert_parallel_ranks.h"

namespace hybridflow {

namespace {

const char* const kExactWeightsFile = "weights_fp32.safetensors";
const char* const kLoraAdapterDir = "lora_adapter";
const char* const kRngKey = "cpu_rng_state";

std::string rng_path(const std::string& dir, const std::string& role, int rank) {
  return dir + "/rng/" + role + "_rank" + std::to_string(rank) + ".safetensors";
}

// Before the layout-free file: one file per pipeline stage and tensor-parallel rank (still read).
std::string layout_optim_path(const std::string& dir, const std::string& role, const MeshCoord& coord) {
  std::string name = dir + "/" + role + "_optim";
  if (coord.pp_size > 1) name += "_pp" + std::to_string(coord.pp) + "of" + std::to_string(coord.pp_size);
  if (coord.tp_size > 1) name += "_tp" + std::to_string(coord.tp) + "of" + std::to_string(coord.tp_size);
  return name + ".pt";
}

std::string optim_path(const std::string& dir, const std::string& role) {
  return dir + "/" + role + "_optim.safetensors";
}

const char* const kOptimFormat = "hybridflow-optimizer-v1";
const char* const kAdamStep = "adam_step/";
// Constants, not std::strings: worker processes may run from a static initializer (worker_main.h), before
// this file's dynamic initialization.
constexpr const char* kMomentKinds[] = {"exp_avg/", "exp_avg_sq/", "master/"};

torch::Tensor& field(TrainEngine::ParameterState& p, const std::string& kind) {
  return kind == "exp_avg/" ? p.exp_avg : kind == "exp_avg_sq/" ? p.exp_avg_sq : p.master;
}

// Collects tensors onto the rank that writes them (tensor-parallel rank 0 of the first stage; the others
// return empty maps): whole tensors over the tensor-parallel group, then every stage's (collective).
std::map<std::string, torch::Tensor> collect_on_writer(const std::map<std::string, torch::Tensor>& mine,
                                                       const CausalLM& model, Communicator* stages) {
  if (!model->pipeline_stage().enabled()) return mine;
  // A pipeline group is one tensor-parallel rank of every stage: only rank 0's groups collect.
  if (model->tensor_parallel().rank() != 0) return {};
  HF_CHECK(stages != nullptr, "checkpoint: the model is pipeline stage ", model->pipeline_stage().stage,
           " but no communicator over the stages was given");
  return gather_named_tensors(mine, *stages, 0, model->parameters().front().device());
}

// Under expert parallelism each rank of a group holds its own experts: the group's rank 0 gets all of them
// (collective over the group); the replicated tensors stay as they are.
std::map<std::string, torch::Tensor> with_group_experts(std::map<std::string, torch::Tensor> mine, const CausalLM& model) {
  const ExpertParallelGroup& ep = model->expert_parallel();
  if (!ep.enabled()) return mine;
  std::map<std::string, torch::Tensor> experts;
  for (auto it = mine.begin(); it != mine.end();) {
    if (is_expert_parameter_name(it->first)) {
      experts.insert(*it);
      it = mine.erase(it);
    } else {
      ++it;
    }
  }
  mine.merge(gather_named_tensors(experts, *ep.comm(), 0, model->parameters().front().device()));
  return mine;
}

std::map<std::string, torch::Tensor> full_parameters_of(const CausalLM& model, Communicator* stages) {
  std::map<std::string, torch::Tensor> mine;
  for (auto& [name, tensor] : gather_full_state(*model)) mine.emplace(name, tensor.to(torch::kCPU, torch::kFloat32));
  return collect_on_writer(with_group_experts(std::move(mine), model), model, stages);
}

// The optimizer state by Hugging Face parameter name, whole, in one file: "exp_avg/<name>",
// "exp_avg_sq/<name>", "master/<name>" (mixed precision) and "adam_step/<name>", plus the engine's step in
// the metadata. Any layout reads its slices back, with or without ZeRO.
void save_optimizer_state(const std::string& path, const MeshCoord& coord, const CausalLM& model,
                          const TrainEngine& engine, Communicator* stages) {
  // ZeRO's partitions are gathered over the data-parallel group first (collective); plain replicas are equal,
  // except for expert parallelism's experts, gathered below.
  const bool experts_split = model->expert_parallel().enabled();
  if (coord.dp != 0 && !engine.sharded_optimizer() && !experts_split) return;
  TrainEngine::NamedState state = engine.named_state();
  if (coord.dp != 0 && !experts_split) return;
  const torch::Device device = model->parameters().front().device();
  std::map<std::string, torch::Tensor> mine;
  for (const std::string kind : kMomentKinds) {
    std::map<std::string, torch::Tensor> shards;
    for (auto& [name, p] : state.parameters)
      if (field(p, kind).defined()) shards.emplace(name, field(p, kind).to(device));
    for (auto& [name, full] : gather_full_tensors(shards, model->config(), model->tensor_parallel()))
      mine.emplace(kind + name, full.to(torch::kCPU));
  }
  for (auto& [name, p] : state.parameters)
    if (p.exp_avg.defined()) mine.emplace(kAdamStep + name, torch::tensor({static_cast<float>(p.adam_step)}));
  mine = with_group_experts(std::move(mine), model);
  if (coord.dp != 0) return;
  const std::map<std::string, torch::Tensor> all = collect_on_writer(mine, model, stages);
  if (coord.tp != 0 || coord.pp != 0) return;
  write_safetensors(path, NamedTensors(all.begin(), all.end()),
                    {{"format", kOptimFormat}, {"step", std::to_string(state.step)}});
}

void load_optimizer_state(const std::string& path, CausalLM& model, TrainEngine& engine) {
  const SafetensorsFile file = map_safetensors(path);
  HF_CHECK(file.metadata.count("format") && file.metadata.at("format") == kOptimFormat, path,
           ": not a hybridflow optimizer state (metadata 'format' is not '", kOptimFormat, "')");
  std::map<std::string, torch::Tensor> saved(file.tensors.begin(), file.tensors.end());
  TrainEngine::NamedState state;
  try {
    state.step = std::stoll(file.metadata.at("step"));
  } catch (const std::exception&) {
    HF_FAIL(path, ": metadata 'step' must be an integer, got '", file.metadata.count("step") ? file.metadata.at("step") : "",
            "'");
  }
  const TensorParallelGroup& tp = model->tensor_parallel();
  for (const auto& item : model->named_parameters(/*recurse=*/true)) {
    TrainEngine::ParameterState p;
    for (const std::string kind : kMomentKinds) {
      auto it = saved.find(kind + item.key());
      if (it != saved.end()) field(p, kind) = checkpoint_shard(item.key(), it->second, model->config(), tp);
    }
    auto step = saved.find(kAdamStep + item.key());
    HF_CHECK(p.exp_avg.defined() == (step != saved.end()), path, ": parameter '", item.key(), "' has ",
             p.exp_avg.defined() ? "moments but no " : "no moments but an ", kAdamStep, item.key());
    if (step != saved.end()) p.adam_step = static_cast<int64_t>(step->second.item<float>());
    state.parameters.emplace(item.key(), std::move(p));
  }
  try {
    engine.load_named_state(state);
  } catch (const Error& e) {
    HF_FAIL(path, ": ", e.what());
  }
}

// Copies each parameter, or this rank's shard of it, out of a file of whole tensors; LoRA adapters the file
// lacks come from the PEFT directory `adapter_dir` beside it.
void copy_weights(const std::string& file, const std::string& adapter_dir, CausalLM& model) {
  std::map<std::string, torch::Tensor> weights;
  for (auto& [name, tensor] : read_safetensors(file).tensors) weights.emplace(name, std::move(tensor));
  if (model->has_lora()) {
    HF_CHECK(file_exists(adapter_dir + "/adapter_model.safetensors"), "checkpoint: the model has LoRA adapters but ",
             adapter_dir, "/adapter_model.safetensors is missing (a checkpoint of a run without LoRA?)");
    weights.merge(read_lora_adapter_tensors(adapter_dir));
  }
  const TensorParallelGroup& tp = model->tensor_parallel();
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters(/*recurse=*/true)) {
    auto it = weights.find(item.key());
    HF_CHECK(it != weights.end(), is_lora_parameter_name(item.key()) ? adapter_dir : file, ": no tensor '", item.key(),
             "' (the checkpoint is of a different model)");
    const torch::Tensor source = checkpoint_shard(item.key(), it->second, model->config(), tp);
    HF_CHECK(source.sizes() == item.value().sizes(), file, ": tensor '", item.key(), "' has shape ",
             it->second.sizes(), ", the model expects ", item.value().sizes(),
             tp.enabled() ? " on this tensor-parallel rank" : "");
    item.value().copy_(source.to(item.value().dtype()));
  }
}

}  // namespace

void save_role_checkpoint(const std::string& dir, const std::string& role, const MeshCoord& coord,
                          const CausalLM& model, const TrainEngine& engine, const std::string& tokenizer_json,
                          Communicator* stages) {
  make_dirs(dir + "/rng");
  save_cpu_rng_state(rng_path(dir, role, coord.rank));
  if (coord.dp != 0) {  // data-parallel replicas hold the same weights; ZeRO's partitions are gathered
    if (model->expert_parallel().enabled()) full_parameters_of(model, stages);  // this rank's experts to the writer
    save_optimizer_state(optim_path(dir, role), coord, model, engine, stages);
    return;
  }
  const std::string model_dir = dir + "/" + role;
  const std::map<std::string, torch::Tensor> full = full_parameters_of(model, stages);
  if (coord.tp == 0 && coord.pp == 0) {
    // The Hugging Face directory holds the base model; LoRA adapters go beside it in PEFT's format.
    std::map<std::string, torch::Tensor> base = full;
    std::erase_if(base, [](const auto& item) { return is_lora_parameter_name(item.first); });
    save_pretrained(model_dir, model->config(), base, Tokenizer::load(tokenizer_json));
    if (model->has_lora())
      save_lora_adapter(model_dir + "/" + kLoraAdapterDir, full, model->lora_config(), model->head_kind(), model_dir);
    // The HF file holds weights in config.torch_dtype; resuming bit for bit needs the float32 values.
    if (model->config().torch_dtype != "float32")
      write_safetensors(model_dir + "/" + kExactWeightsFile, NamedTensors(full.begin(), full.end()));
  }
  save_optimizer_state(optim_path(dir, role), coord, model, engine, stages);
}

void load_role_checkpoint(const std::string& dir, const std::string& role, const MeshCoord& coord, CausalLM& model,
                          TrainEngine& engine) {
  const std::string model_dir = dir + "/" + role;
  const std::string exact = model_dir + "/" + kExactWeightsFile;
  const std::string hf = model_dir + "/model.safetensors";
  HF_CHECK(file_exists(exact) || file_exists(hf), "checkpoint ", dir, ": role '", role, "' has no weights (", hf,
           " is missing)");
  copy_weights(file_exists(exact) ? exact : hf, model_dir + "/" + kLoraAdapterDir, model);
  const std::string optim = optim_path(dir, role);
  const std::string layout_optim = layout_optim_path(dir, role, coord);
  if (file_exists(optim)) {
    load_optimizer_state(optim, model, engine);
  } else {
    HF_CHECK(file_exists(layout_optim), "checkpoint ", dir, ": ", optim, " is missing (role '", role,
             "' has no optimizer state; the weights in ", model_dir, " can start a new run with model.path)");
    engine.load_state(layout_optim);  // a checkpoint from before the layout-free format: the same layout only
  }

  // A run resumed on more processes than saved it has no file for the new ranks. Their generators keep
  // their own seeds; nothing in today's dataflow draws from them (see save_cpu_rng_state).
  const std::string rng_file = rng_path(dir, role, coord.rank);
  if (file_exists(rng_file))
    load_cpu_rng_state(rng_file);
  else
    log_warn("checkpoint ", dir, ": no RNG state for role '", role, "' rank ", coord.rank,
             " (the run was saved by fewer processes); this rank's default generator keeps its seed");
}

void save_role_lora_adapter(const std::string& dir, const MeshCoord& coord, const CausalLM& model,
                            const std::string& base_model_name_or_path, Communicator* stages) {
  HF_CHECK(model->has_lora(), "save_role_lora_adapter(", dir, "): the model has no LoRA adapters");
  if (coord.dp != 0) return;  // data-parallel replicas hold the same adapters
  std::map<std::string, torch::Tensor> mine;
  for (auto& [name, tensor] : gather_full_state(*model))
    if (is_lora_parameter_name(name)) mine.emplace(name, tensor.to(torch::kCPU, torch::kFloat32));
  const std::map<std::string, torch::Tensor> all = collect_on_writer(mine, model, stages);
  if (coord.tp == 0 && coord.pp == 0)
    save_lora_adapter(dir, all, model->lora_config(), model->head_kind(), base_model_name_or_path);
}

// The default generator drives nothing in today's dataflow (sampling and shuffling use generators
// seeded from step counters), but anything added later that draws from it must resume too.
void save_cpu_rng_state(const std::string& path) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  torch::Tensor state;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    state = gen.get_state();
  }
  write_safetensors(path, {{kRngKey, state}});
}

void load_cpu_rng_state(const std::string& path) {
  HF_CHECK(file_exists(path), "RNG state ", path, " is missing");
  torch::Tensor state;
  for (auto& [name, tensor] : read_safetensors(path).tensors)
    if (name == kRngKey) state = tensor;
  HF_CHECK(state.defined(), path, ": no tensor '", kRngKey, "'");
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  try {
    gen.set_state(state);
  } catch (const std::exception& e) {
    HF_FAIL(path, ": not a CPU generator state: ", e.what());
  }
}

}  // namespace hybridflow
