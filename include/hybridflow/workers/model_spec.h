// How an RL worker builds its model from the ModelSpec its worker group was created with (a directory, or
// a preset with a vocabulary and an init seed); every rank of a group builds the same weights, so
// data-parallel ranks start identical.
#pragma once

#include <nlohmann/json.hpp>

#include "hybridflow/model/transformer.h"
#include "hybridflow/parallel/collectives.h"
#include "hybridflow/parallel/tensor_parallel.h"
#include "hybridflow/workers/role_specs.h"

namespace hybridflow {

// The spec (workers/role_specs.h): a directory (path; then the preset and dimensions are not used) or a
// preset with the tokenizer's vocab_size, dimensions (0 = the preset's), init_seed and ids; device ("cpu" |
// "cuda": this process's CUDA device, see worker_device); dtype ("fp32" | "bf16": the parameters' and
// activations' dtype; a trained bf16 model keeps fp32 master weights in its TrainEngine);
// enable_gradient_checkpointing (activation checkpointing of every decoder layer while training,
// transformer.h). An error names what is missing when the spec is incomplete.
// With a tensor-parallel group the model holds this rank's shards of exactly the weights one process would
// build: a directory is read slice by slice, a preset is made whole from init_seed and then split, and a
// value head that the directory lacks starts from init_seed whatever the split. With a pipeline stage it
// holds only that stage's part of those weights. With LoRA in the spec (lora, lora_adapter_path) the model
// gets its adapters and only they (and a value head) train: the base weights are frozen (requires_grad
// false), so a TrainEngine over the model keeps no gradient, optimizer state or master copy for them.
// The architecture build_model gives the spec: the directory's config.json, or the preset with the spec's
// dimensions and ids over it (checked). For the controller, which sizes and checks without building.
ModelConfig model_config_of(const ModelSpec& spec);

CausalLM build_model(const ModelSpec& spec, HeadKind head, const TensorParallelGroup& tp = {},
                     const PipelineStage& stage = {});

// The device the spec's model goes to in this process.
torch::Device model_device(const ModelSpec& spec);

// Sum of squares of all parameters: a cheap fingerprint to tell whether weights changed.
double parameter_sq_norm(torch::nn::Module& module);
// The same of the whole model when it is split: collective over its tensor-parallel group and, when it is
// a pipeline stage, over `stages` (one rank per stage; a tied embedding's copy on the last stage counts once).
double parameter_sq_norm(const CausalLM& model, Communicator* stages = nullptr);

}  // namespace hybridflow
