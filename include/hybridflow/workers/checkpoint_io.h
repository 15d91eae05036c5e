// What one trainable role (actor or critic) writes into an RL checkpoint directory and reads back on
// resume, so that the resumed run continues bit for bit:
//   <dir>/<role>/               HF model directory (config.json, model.safetensors, tokenizer.json): usable on
//                               its own by `hybridflow generate` / transformers
//   <dir>/<role>/weights_fp32.safetensors  only when config.torch_dtype is not float32: the exact weights
//   <dir>/<role>_optim.pt       AdamW moments + optimizer step (the step drives the LR schedule and the
//                               PPO mini-batch shuffling seeds); <role>_optim_tp<i>of<t>.pt per shard when the
//                               model is split over t tensor-parallel ranks, <role>_optim_pp<j>of<p>[_tp..].pt
//                               per pipeline stage
//   <dir>/rng/<role>_rank<r>.safetensors  the process's default CPU generator, per rank
// Weights and optimizer state are written by data-parallel group 0 only (replicas are identical); a split
// model is gathered and written whole (its shards over the tensor-parallel group, its stages onto the first
// stage), so the weights load into any layout.
#pragma once

#include <string>

#include "hybridflow/engine/train_engine.h"
#include "hybridflow/model/transformer.h"
#include "hybridflow/runtime/mesh_coord.h"

namespace hybridflow {

// tokenizer_json: path of the run's tokenizer.json, copied into the HF directory.
// Collective over the role's tensor-parallel groups and, for a pipeline stage, over `stages` (the
// communicator over the model's pipeline group).
void save_role_checkpoint(const std::string& dir, const std::string& role, const MeshCoord& coord,
                          const CausalLM& model, const TrainEngine& engine, const std::string& tokenizer_json,
                          Communicator* stages = nullptr);

// Loads into the existing model and engine (their parameters are shared, so the engine keeps working).
// Every rank reads the weights and optimizer state; errors name the missing or mismatching file.
void load_role_checkpoint(const std::string& dir, const std::string& role, const MeshCoord& coord, CausalLM& model,
                          TrainEngine& engine);

// The process's default CPU generator state as a one-tensor safetensors file (atomic write); loading
// errors name the file.
void save_cpu_rng_state(const std::string& path);
void load_cpu_rng_state(const std::string& path);

}  // namespace hybridflow
