#include "hybridflow/workers/checkpoint_io.h"

#include <ATen/CPUGeneratorImpl.h>

#include <map>
#include <mutex>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/model/safetensors.h"
#include "hybridflow/model/tensor_parallel_layout.h"
#include "hybridflow/model/tokenizer.h"
#include "hybridflow/parallel/gather_named.h"

namespace hybridflow {

namespace {

const char* const kExactWeightsFile = "weights_fp32.safetensors";
const char* const kRngKey = "cpu_rng_state";

std::string rng_path(const std::string& dir, const std::string& role, int rank) {
  return dir + "/rng/" + role + "_rank" + std::to_string(rank) + ".safetensors";
}

// The optimizer state follows the parameters' shards: one file per pipeline stage and tensor-parallel rank.
std::string optim_path(const std::string& dir, const std::string& role, const MeshCoord& coord) {
  std::string name = dir + "/" + role + "_optim";
  if (coord.pp_size > 1) name += "_pp" + std::to_string(coord.pp) + "of" + std::to_string(coord.pp_size);
  if (coord.tp_size > 1) name += "_tp" + std::to_string(coord.tp) + "of" + std::to_string(coord.tp_size);
  return name + ".pt";
}

// Whole fp32 tensors, on the CPU of the rank that writes them (tensor-parallel rank 0 of the first stage;
// empty elsewhere): a split model is gathered over its tensor-parallel group and its stages (collective).
std::map<std::string, torch::Tensor> full_parameters_of(const CausalLM& model, Communicator* stages) {
  std::map<std::string, torch::Tensor> mine;
  for (auto& [name, tensor] : gather_full_state(*model)) mine.emplace(name, tensor.to(torch::kCPU, torch::kFloat32));
  if (!model->pipeline_stage().enabled()) return mine;
  // A pipeline group is one tensor-parallel rank of every stage: only rank 0's groups collect.
  if (model->tensor_parallel().rank() != 0) return {};
  HF_CHECK(stages != nullptr, "checkpoint: the model is pipeline stage ", model->pipeline_stage().stage,
           " but no communicator over the stages was given");
  return gather_named_tensors(mine, *stages, 0, model->parameters().front().device());
}

// Copies each parameter, or this rank's shard of it, out of a file of whole tensors.
void copy_weights(const std::string& file, CausalLM& model) {
  std::map<std::string, torch::Tensor> weights;
  for (auto& [name, tensor] : read_safetensors(file).tensors) weights.emplace(name, std::move(tensor));
  const TensorParallelGroup& tp = model->tensor_parallel();
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters(/*recurse=*/true)) {
    auto it = weights.find(item.key());
    HF_CHECK(it != weights.end(), file, ": no tensor '", item.key(), "' (the checkpoint is of a different model)");
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
  if (coord.dp != 0) return;  // data-parallel replicas hold the same shards
  const std::string model_dir = dir + "/" + role;
  const std::map<std::string, torch::Tensor> full = full_parameters_of(model, stages);
  if (coord.tp == 0 && coord.pp == 0) {
    save_pretrained(model_dir, model->config(), full, Tokenizer::load(tokenizer_json));
    // The HF file holds weights in config.torch_dtype; resuming bit for bit needs the float32 values.
    if (model->config().torch_dtype != "float32")
      write_safetensors(model_dir + "/" + kExactWeightsFile, NamedTensors(full.begin(), full.end()));
  }
  engine.save_state(optim_path(dir, role, coord));
}

void load_role_checkpoint(const std::string& dir, const std::string& role, const MeshCoord& coord, CausalLM& model,
                          TrainEngine& engine) {
  const std::string model_dir = dir + "/" + role;
  const std::string exact = model_dir + "/" + kExactWeightsFile;
  const std::string hf = model_dir + "/model.safetensors";
  HF_CHECK(file_exists(exact) || file_exists(hf), "checkpoint ", dir, ": role '", role, "' has no weights (", hf,
           " is missing)");
  copy_weights(file_exists(exact) ? exact : hf, model);
  const std::string optim = optim_path(dir, role, coord);
  HF_CHECK(file_exists(optim), "checkpoint ", dir, ": ", optim, " is missing: the optimizer state was saved for ",
           "another layout of role '", role, "' than tensor_model_parallel_size ", coord.tp_size,
           ", pipeline_model_parallel_size ", coord.pp_size, " (the weights in ", model_dir,
           " load into any layout: start a new run from them with model.path)");
  engine.load_state(optim);

  const std::string rng_file = rng_path(dir, role, coord.rank);
  HF_CHECK(file_exists(rng_file), "checkpoint ", dir, ": ", rng_file, " is missing (was the run saved with ",
           "fewer '", role, "' processes?)");
  load_cpu_rng_state(rng_file);
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
