#include "hybridflow/model/pipeline_layout.h"

#include "hybridflow/core/error.h"

namespace hybridflow {

int owning_stage(const std::string& name, const ModelConfig& config, int stages) {
  if (stages == 1) return 0;
  const std::string layers = "model.layers.";
  if (name.starts_with(layers)) {
    const size_t end = name.find('.', layers.size());
    int64_t index = -1;
    try {
      index = std::stoll(name.substr(layers.size(), end - layers.size()));
    } catch (const std::exception&) {
      HF_FAIL("pipeline layout: '", name, "' names no decoder layer index");
    }
    HF_CHECK(index >= 0 && index < config.num_hidden_layers, "pipeline layout: '", name, "' is outside the ",
             config.num_hidden_layers, " layers of num_hidden_layers");
    for (int s = 0; s < stages; ++s) {
      const Partition p = stage_layers(config.num_hidden_layers, PipelineStage{s, stages});
      if (index >= p.start && index < p.start + p.length) return s;
    }
  }
  if (name == "model.embed_tokens.weight") return 0;
  if (name.starts_with("model.norm.") || name.starts_with("lm_head.") || name.starts_with("score."))
    return stages - 1;
  HF_FAIL("pipeline layout: '", name, "' is not a weight of a causal language model");
}

bool stage_holds(const std::string& name, const ModelConfig& config, HeadKind head, const PipelineStage& stage) {
  if (owning_stage(name, config, stage.stages) == stage.stage) return true;
  return stage.last() && head == HeadKind::kLanguageModel && config.tie_word_embeddings &&
         name == "model.embed_tokens.weight";
}

}  // namespace hybridflow
