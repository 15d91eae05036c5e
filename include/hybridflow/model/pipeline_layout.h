// Which pipeline stage holds each weight of a CausalLM (transformer.h), by its Hugging Face name: decoder
// layer N's weights on the stage whose layers contain N, the embedding on the first stage, the final norm
// and the head (lm_head or score) on the last. The last stage's copy of a tied embedding is a copy: the
// first stage owns the weight.
#pragma once

#include <string>

#include "hybridflow/model/model_config.h"
#include "hybridflow/model/transformer.h"
#include "hybridflow/parallel/pipeline_parallel.h"

namespace hybridflow {

// The stage of `stages` that owns the weight; throws naming the weight when the name is not a CausalLM's.
int owning_stage(const std::string& name, const ModelConfig& config, int stages);

// True when `stage` of a model with this head holds a weight of this name: its owner, or the last stage
// for the embedding a language-model head is tied to.
bool stage_holds(const std::string& name, const ModelConfig& config, HeadKind head, const PipelineStage& stage);

}  // namespace hybridflow
