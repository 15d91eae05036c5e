// Pipeline parallelism's model-free pieces: which stage a rank is, how the decoder layers split over the
// stages, and the order in which a stage runs its micro-batches' forward and backward passes.
//
// The schedule is 1F1B (PipeDream-Flush, Megatron-LM's non-interleaved schedule): stage s of p first runs
// min(p - 1 - s, m) forward passes (warm-up), then alternates one forward and one backward until every
// forward has run, then runs the remaining backwards (cool-down). A stage never holds the activations of
// more than p - s micro-batches, against all m for GPipe's all-forward-then-all-backward, and the results
// are identical to running the micro-batches one after another.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hybridflow/parallel/tensor_parallel.h"

namespace hybridflow {

// This rank's place in a pipeline. Default: one stage holding the whole model.
struct PipelineStage {
  int stage = 0;
  int stages = 1;
  bool enabled() const { return stages > 1; }
  bool first() const { return stage == 0; }
  bool last() const { return stage == stages - 1; }
};

// The layers [start, start + length) that stage `stage` holds: consecutive, num_layers / stages each.
// Throws naming num_hidden_layers when the layers do not divide evenly.
Partition stage_layers(int64_t num_layers, const PipelineStage& stage);

struct PipelineOp {
  enum Kind { kForward, kBackward };
  Kind kind;
  int64_t micro_batch;
  bool operator==(const PipelineOp& o) const { return kind == o.kind && micro_batch == o.micro_batch; }
};

// Stage `stage`'s 1F1B sequence of 2 * micro_batches passes (see above).
std::vector<PipelineOp> one_forward_one_backward(const PipelineStage& stage, int64_t micro_batches);

// "F0 F1 B0 F2 B1 B2": for docs and error messages.
std::string to_string(const std::vector<PipelineOp>& ops);

}  // namespace hybridflow
