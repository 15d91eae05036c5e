// Pipeline parallelism for a CausalLM split into stages (transformer.h, pipeline_parallel.h): this rank's
// stage, the communicator over the stages, and the passes that move hidden states forward and their
// gradients backward between neighbouring stages with point-to-point sends.
//
// Training runs the 1F1B schedule (TrainEngine::set_pipeline); inference runs every micro-batch through
// the stages once (pipeline_forward). A micro-batch's shape is known to every stage from its own copy of the
// batch, so activations travel without headers. Sends are non-blocking (both neighbours send before they
// receive in 1F1B's steady state); an activation's send completes when its gradient comes back, the rest
// before the step returns.
#pragma once

#include <torch/torch.h>

#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "hybridflow/core/data_proto.h"
#include "hybridflow/model/transformer.h"
#include "hybridflow/parallel/collectives.h"

namespace hybridflow {

// One micro-batch's forward pass on a stage: what its backward pass needs.
struct StagePass {
  torch::Tensor output;  // the last stage: what last_stage returned; others: the hidden states sent on
  torch::Tensor input;   // the hidden states received from the stage before (undefined on the first stage)
};

class PipelineStageRunner {
 public:
  // stages: one rank per stage, in stage order (rank = model's stage); must outlive the runner. The model's
  // inputs are the micro-batch's `input_ids` and `attention_mask` tensors.
  PipelineStageRunner(CausalLM model, Communicator& stages, std::string ids_key = "input_ids",
                      std::string mask_key = "attention_mask");

  const PipelineStage& stage() const { return model_->pipeline_stage(); }
  Communicator& stages() { return stages_; }

  // A forward pass of one micro-batch on this stage. A later stage first receives its input from the stage
  // before (with a gradient when `training`). A stage before the last runs its layers and sends the result
  // on; the last stage's output is last_stage(micro), which runs the model's forward (a loss, log-probs,
  // values) and finds the received input set on the model.
  StagePass forward(const DataProto& micro, bool training,
                    const std::function<torch::Tensor(const DataProto&)>& last_stage);
  // The backward pass of a micro-batch's forward pass (the last stage differentiates its output, a loss;
  // the others receive their output's gradient from the next stage). Sends the input's gradient to the
  // stage before.
  void backward(const StagePass& pass);
  // Completes every send in flight.
  void wait_sends();
  // Runs around every micro-batch's forward on this stage, the last included (null: nothing): `before` first,
  // `after` once the stage's output exists. For per-stage model state that a forward sets or leaves behind
  // (router replay's routing); the last stage's last_stage() runs between the two.
  using MicroBatchHook = std::function<void(const DataProto&)>;
  void set_micro_batch_hooks(MicroBatchHook before, MicroBatchHook after);
  // The most activations this stage has had in flight to the next at once (each holds a micro-batch's
  // hidden states): a send completes once the next stage's gradient for it arrives, so under 1F1B this
  // stays at the number of stages after this one plus one, however many micro-batches a step has.
  size_t peak_activation_sends() const { return peak_activation_sends_; }

  // Gradients of parameters held by both the first and the last stage (a tied lm_head's
  // model.embed_tokens.weight) are summed over the two; the other stages take part with zeros.
  bool has_tied_embedding() const;
  int64_t tied_embedding_numel() const;
  // True on the first and the last stage for the tied parameter's name.
  bool is_tied(const std::string& name) const;
  // True for the last stage's copy of a tied parameter: it is the first stage's, counted once in norms.
  bool is_tied_copy(const std::string& name) const { return is_tied(name) && !stage().first(); }

 private:
  CausalLM model_;
  Communicator& stages_;
  std::string ids_key_, mask_key_;
  MicroBatchHook before_, after_;
  std::deque<ProcessGroup::PendingSend> activation_sends_;  // oldest micro-batch first
  std::vector<ProcessGroup::PendingSend> gradient_sends_;
  size_t peak_activation_sends_ = 0;
};

// Inference: runs every micro-batch (of micro_batch_size rows) through the stages and returns, on the last
// stage, the rows of last_stage(micro) concatenated along dim 0; undefined on the other stages.
torch::Tensor pipeline_forward(PipelineStageRunner& runner, const DataProto& batch, int64_t micro_batch_size,
                               const std::function<torch::Tensor(const DataProto&)>& last_stage);
// The same over micro-batches the caller formed (of any shapes: every stage sees the same list): one output
// per micro-batch on the last stage, undefined ones elsewhere.
std::vector<torch::Tensor> pipeline_forward(PipelineStageRunner& runner, const std::vector<DataProto>& micro_batches,
                                            const std::function<torch::Tensor(const DataProto&)>& last_stage);

}  // namespace hybridflow
