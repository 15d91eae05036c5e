#include "hybridflow/parallel/pipeline_parallel.h"

#include <algorithm>
#include <sstream>

#include "hybridflow/core/error.h"

namespace hybridflow {

Partition stage_layers(int64_t num_layers, const PipelineStage& stage) {
  HF_CHECK(stage.stages >= 1 && stage.stage >= 0 && stage.stage < stage.stages, "pipeline stage ", stage.stage,
           " of ", stage.stages, " is not a stage");
  HF_CHECK(num_layers >= stage.stages, "pipeline parallelism: num_hidden_layers = ", num_layers,
           " is fewer than the ", stage.stages, " pipeline stages (every stage needs at least one layer)");
  HF_CHECK(num_layers % stage.stages == 0, "num_hidden_layers = ", num_layers,
           " does not divide by the pipeline-parallel size ", stage.stages,
           "; choose a pipeline_model_parallel_size that divides it");
  const int64_t length = num_layers / stage.stages;
  return {stage.stage * length, length};
}

std::vector<PipelineOp> one_forward_one_backward(const PipelineStage& stage, int64_t micro_batches) {
  HF_CHECK(micro_batches >= 0, "one_forward_one_backward: negative micro-batch count ", micro_batches);
  const int64_t warmup = std::min<int64_t>(stage.stages - 1 - stage.stage, micro_batches);
  std::vector<PipelineOp> ops;
  ops.reserve(static_cast<size_t>(2 * micro_batches));
  int64_t forward = 0, backward = 0;
  for (; forward < warmup; ++forward) ops.push_back({PipelineOp::kForward, forward});
  for (; forward < micro_batches; ++forward, ++backward) {
    ops.push_back({PipelineOp::kForward, forward});
    ops.push_back({PipelineOp::kBackward, backward});
  }
  for (; backward < micro_batches; ++backward) ops.push_back({PipelineOp::kBackward, backward});
  return ops;
}

std::string to_string(const std::vector<PipelineOp>& ops) {
  std::ostringstream out;
  for (size_t i = 0; i < ops.size(); ++i)
    out << (i ? " " : "") << (ops[i].kind == PipelineOp::kForward ? 'F' : 'B') << ops[i].micro_batch;
  return out.str();
}

}  // namespace hybridflow
