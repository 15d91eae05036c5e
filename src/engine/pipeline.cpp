#include "hybridflow/engine/pipeline.h"

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

torch::Tensor PipelineStageRunner::forward(const DataProto& micro, bool training,
                                           const std::function<torch::Tensor(const DataProto&)>& last_stage) {
  const PipelineStage& s = stage();
  const torch::Tensor& ids = micro.tensor(ids_key_);
  last_input_ = torch::Tensor();
  if (!s.first()) {
    torch::Tensor input = model_->stage_activation_like(ids.size(0), ids.size(1));
    stages_.recv(input, s.stage - 1, kActivationTag);
    if (training) input.set_requires_grad(true);
    model_->set_stage_input(input);
    last_input_ = input;
  }
  if (s.last()) return last_stage(micro);
  torch::Tensor out = model_->hidden_states(ids, micro.tensor(mask_key_));
  sends_.push_back(stages_.isend(out.detach(), s.stage + 1, kActivationTag));
  return out;
}

void PipelineStageRunner::backward(const torch::Tensor& output, const torch::Tensor& input) {
  const PipelineStage& s = stage();
  if (s.last()) {
    output.backward();
  } else {
    torch::Tensor grad = torch::empty_like(output, output.options().requires_grad(false));
    stages_.recv(grad, s.stage + 1, kGradientTag);
    output.backward(grad);
  }
  if (!s.first()) {
    HF_CHECK(input.defined() && input.grad().defined(), "pipeline stage ", s.stage,
             ": the backward pass left no gradient for the stage's input");
    sends_.push_back(stages_.isend(input.grad(), s.stage - 1, kGradientTag));
  }
}

void PipelineStageRunner::wait_sends() {
  for (auto& send : sends_) send.wait();
  sends_.clear();
}

bool PipelineStageRunner::has_tied_embedding() const {
  return stage().enabled() && model_->head_kind() == HeadKind::kLanguageModel &&
         model_->config().tie_word_embeddings;
}

int64_t PipelineStageRunner::tied_embedding_numel() const {
  const auto& c = model_->config();
  return c.vocab_size / model_->tensor_parallel().size() * c.hidden_size;
}

bool PipelineStageRunner::is_tied_copy(const std::string& name) const {
  return has_tied_embedding() && !stage().first() && name == "model.embed_tokens.weight";
}

torch::Tensor pipeline_forward(PipelineStageRunner& runner, const DataProto& batch, int64_t micro_batch_size,
                               const std::function<torch::Tensor(const DataProto&)>& last_stage) {
  HF_CHECK(micro_batch_size > 0, "pipeline_forward: micro_batch_size must be > 0, got ", micro_batch_size);
  std::vector<torch::Tensor> outputs;
  const int64_t rows = batch.batch_size();
  for (int64_t begin = 0; begin < rows; begin += micro_batch_size) {
    torch::Tensor out = runner.forward(batch.slice(begin, std::min(rows, begin + micro_batch_size)),
                                       /*training=*/false, last_stage);
    if (runner.stage().last()) outputs.push_back(out);
  }
  runner.wait_sends();
  return outputs.empty() ? torch::Tensor() : torch::cat(outputs, 0);
}

}  // namespace hybridflow
