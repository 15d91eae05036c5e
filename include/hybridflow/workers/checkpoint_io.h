// What one trainable role (actor or critic) writes into an RL checkpoint directory and reads back on
// resume, so that the resumed run continues bit for bit, in the same layout or in any other:
//   <dir>/<role>/               HF model directory (config.json, model.safetensors, tokenizer.json): usable on
//                               its own by `hybridflow generate` / transformers
//   <dir>/<role>/weights_fp32.safetensors  only when config.torch_dtype is not float32: the exact weights
//   <dir>/<role>/lora_adapter/  with LoRA: the adapters in PEFT's format (adapter_config.json,
//                               adapter_model.safetensors, fp32); <dir>/<role> then holds the base model
//   <dir>/<role>_optim.safetensors  the optimizer state by HF parameter name, whole tensors: exp_avg/<name>,
//                               exp_avg_sq/<name>, master/<name> (fp32 masters of bf16/fp16 weights),
//                               adam_step/<name>; metadata "step" (drives the LR schedule and the PPO
//                               mini-batch shuffling seeds)
//   <dir>/rng/<role>_rank<r>.safetensors  the process's default CPU generator, per rank
// Weights are written by data-parallel group 0 (replicas are identical); a ZeRO-partitioned optimizer state
// is first gathered over the data-parallel group. Shards are gathered over the tensor-parallel group and
// stages onto one rank and written whole; every rank of the loading run reads its own slices, so t, p, d
// and ZeRO may all change between resumptions. The per-layout <role>_optim[_pp<j>of<p>][_tp<i>of<t>].pt of
// earlier checkpoints still loads into the layout that wrote it.
#pragma once

#include <string>

#include "hybridflow/engine/train_engine.h"
#include "hybridflow/model/transformer.h"
#include "hybridflow/runtime/mesh_coord.h"

namespace hybridflow {

// tokenizer_json: path of the run's tokenizer.json, copied into the HF directory.
// Collective over the role's tensor-parallel groups, over its data-parallel groups when the optimizer is
// ZeRO-partitioned and, for a pipeline stage, over `stages` (the communicator over the model's pipeline
// group).
void save_role_checkpoint(const std::string& dir, const std::string& role, const MeshCoord& coord,
                          const CausalLM& model, const TrainEngine& engine, const std::string& tokenizer_json,
                          Communicator* stages = nullptr);

// Loads into the existing model and engine (their parameters are shared, so the engine keeps working).
// Every rank reads its slices of the weights and optimizer state; errors name the missing or mismatching
// file. A rank the saving run did not have keeps its generator (a warning says so).
void load_role_checkpoint(const std::string& dir, const std::string& role, const MeshCoord& coord, CausalLM& model,
                          TrainEngine& engine);

// A LoRA model's adapters as a PEFT directory `dir` (fp32), written by the rank that writes checkpoints.
// Collective like save_role_checkpoint (over the tensor-parallel group and `stages`).
void save_role_lora_adapter(const std::string& dir, const MeshCoord& coord, const CausalLM& model,
                            const std::string& base_model_name_or_path, Communicator* stages = nullptr);

// The process's default CPU generator state as a one-tensor safetensors file (atomic write); loading
// errors name the file.
void save_cpu_rng_state(const std::string& path);
void load_cpu_rng_state(const std::string& path);

}  // namespace hybridflow
