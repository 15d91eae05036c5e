#include "hybridflow/engine/pipeline.h"

#include <algorithm>

#include "hybridflow/core/error.h"

namespace hybridflow {
namespace {

// Point-to-point tags: activations flow to the next stage, gradients to the one before. Between a pair of
// ranks each direction is ordered, so the tags only keep the two kinds apart.
constexpr int kActivationTag = 1;
constexpr int kGradientTag = 2;

}  // namespace

PipelineStageRunner::PipelineStageRunner(CausalLM model, Communicator& stages, std::string ids_key,
                                         std::string mask_key)
    : model_(std::move(model)), stages_(stages), ids_key_(std::move(ids_key)), mask_key_(std::move(mask_key)) {
  const PipelineStage& s = model_->pipeline_stage();
  HF_CHECK(s.stages == stages_.size() && s.stage == stages_.rank(), "PipelineStageRunner: the model is stage ",
           s.stage, " of ", s.stages, " but this rank is ", stages_.rank(), " of a pipeline group of ",
           stages_.size());
}

StagePass PipelineStageRunner::forward(const DataProto& micro, bool training,
                                       const std::function<torch::Tensor(const DataProto&)>& last_stage) {
  const PipelineStage& s = stage();
  const torch::Tensor& ids = micro.tensor(ids_key_);
  if (before_) before_(micro);
  StagePass pass;
  if (!s.first()) {
    pass.input = model_->stage_activation_like(ids.size(0), ids.size(1));
    stages_.recv(pass.input, s.stage - 1, kActivationTag);
    if (training) pass.input.set_requires_grad(true);
    model_->set_stage_input(pass.input);
  }
  if (s.last()) {
    pass.output = last_stage(micro);
  } else {
    pass.output = model_->hidden_states(ids, micro.tensor(mask_key_));
    activation_sends_.push_back(stages_.isend(pass.output.detach(), s.stage + 1, kActivationTag));
    peak_activation_sends_ = std::max(peak_activation_sends_, activation_sends_.size());
  }
  if (after_) after_(micro);
  return pass;
}

void PipelineStageRunner::set_micro_batch_hooks(MicroBatchHook before, MicroBatchHook after) {
  before_ = std::move(before);
  after_ = std::move(after);
}

void PipelineStageRunner::backward(const StagePass& pass) {
  const PipelineStage& s = stage();
  if (s.last()) {
    pass.output.backward();
  } else {
    torch::Tensor grad = torch::empty_like(pass.output, pass.output.options().requires_grad(false));
    stages_.recv(grad, s.stage + 1, kGradientTag);
    // The next stage has run this micro-batch's backward, so it received the activation sent for it, the
    // oldest in flight (micro-batches go forward and backward in order): completing that send now lets
    // the activation go with this pass instead of at the end of the step.
    if (!activation_sends_.empty()) {
      activation_sends_.front().wait();
      activation_sends_.pop_front();
    }
    pass.output.backward(grad);
  }
  if (!s.first()) {
    HF_CHECK(pass.input.defined() && pass.input.grad().defined(), "pipeline stage ", s.stage,
             ": the backward pass left no gradient for the stage's input");
    gradient_sends_.push_back(stages_.isend(pass.input.grad(), s.stage - 1, kGradientTag));
  }
}

void PipelineStageRunner::wait_sends() {
  for (auto& send : activation_sends_) send.wait();
  activation_sends_.clear();
  for (auto& send : gradient_sends_) send.wait();
  gradient_sends_.clear();
}

bool PipelineStageRunner::has_tied_embedding() const {
  return stage().enabled() && model_->head_kind() == HeadKind::kLanguageModel &&
         model_->config().tie_word_embeddings;
}

int64_t PipelineStageRunner::tied_embedding_numel() const {
  const auto& c = model_->config();
  const auto& tp = model_->tensor_parallel();
  return even_partition(c.vocab_size, tp.size(), tp.rank(), "vocab_size").length * c.hidden_size;
}

bool PipelineStageRunner::is_tied(const std::string& name) const {
  return has_tied_embedding() && (stage().first() || stage().last()) && name == "model.embed_tokens.weight";
}

torch::Tensor pipeline_forward(PipelineStageRunner& runner, const DataProto& batch, int64_t micro_batch_size,
                               const std::function<torch::Tensor(const DataProto&)>& last_stage) {
  HF_CHECK(micro_batch_size > 0, "pipeline_forward: micro_batch_size must be > 0, got ", micro_batch_size);
  std::vector<DataProto> micro_batches;
  const int64_t rows = batch.batch_size();
  for (int64_t begin = 0; begin < rows; begin += micro_batch_size)
    micro_batches.push_back(batch.slice(begin, std::min(rows, begin + micro_batch_size)));
  std::vector<torch::Tensor> outputs = pipeline_forward(runner, micro_batches, last_stage);
  return runner.stage().last() ? torch::cat(outputs, 0) : torch::Tensor();
}

std::vector<torch::Tensor> pipeline_forward(PipelineStageRunner& runner, const std::vector<DataProto>& micro_batches,
                                            const std::function<torch::Tensor(const DataProto&)>& last_stage) {
  std::vector<torch::Tensor> outputs;
  for (const DataProto& micro : micro_batches) {
    StagePass pass = runner.forward(micro, /*training=*/false, last_stage);
    outputs.push_back(runner.stage().last() ? pass.output : torch::Tensor());
  }
  runner.wait_sends();
  return outputs;
}

}  // namespace hybridflow
