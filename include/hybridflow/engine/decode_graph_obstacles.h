// Where the decode steps cannot replay as CUDA graphs (GenerationConfig::cuda_graphs), and the refusal when
// graphs were asked for explicitly (GenerationConfig::require_cuda_graphs: the trainer's
// actor_rollout_ref.rollout.enforce_eager set to false). Graphs by default (enforce_eager unset on a GPU) decode
// such steps eagerly without a word; graphs asked for by name fail naming what stands in the way instead of
// running slower than asked. On the CPU every step decodes eagerly either way.
#pragma once

#include <string>

#include "hybridflow/engine/generation.h"
#include "hybridflow/model/transformer.h"

namespace hybridflow {

// What keeps generate()'s decode steps with `cfg` on `model` (in its present state: adapters merged or not,
// batch-invariant kernels on or not, router recording) from replaying as CUDA graphs on a CUDA device, naming
// the configuration key where there is one; "" where they replay. Graphs replay the paged cache's steps on the
// continuous-batching path for one rank's whole dense model (CausalLM::decodes_on_device), without weights
// refreshed mid-generation and without a routing record. Independent of the model's device (callable on the
// CPU).
std::string decode_graph_obstacle(CausalLM& model, const GenerationConfig& cfg);

// With cfg.cuda_graphs and cfg.require_cuda_graphs on a model on a CUDA device: fails, naming
// actor_rollout_ref.rollout.enforce_eager, where the steps would decode eagerly: for decode_graph_obstacle's
// reasons, or for `path_obstacle` when given (a generation path that never replays graphs). Otherwise nothing.
void check_required_decode_graphs(CausalLM& model, const GenerationConfig& cfg, const char* path_obstacle = nullptr);

}  // namespace hybridflow
