#include "hybridflow/engine/expert_reshard.h"

#include <torch/torch.h>

#include <chrono>

#include "hybridflow/core/error.h"

namespace hybridflow {
ExpertReshard::ExpertReshard(CausalLM train, int generation_size, const std::string& key, Communicator* stages)
    : train_(std::move(train)), generation_size_(generation_size), stages_(stages) {
  HF_CHECK(stages != nullptr || !train_->pipeline_stage().enabled(), "ExpertReshard: the model is pipeline stage ",
           train_->pipeline_stage().stage, " of ", train_->pipeline_stage().stages,
           " and needs the communicator over its stages");
  const int n = train_->expert_parallel().size();
  HF_CHECK(train_->expert_parallel().enabled(), "ExpertReshard: the model's experts are not split");
  HF_CHECK(generation_size == 1 || generation_size == n, key, " = ", generation_size, " must be 1 (generate on the ",
           "experts gathered from the group) or the actor's expert_model_parallel_size ", n,
           " (generate with the experts where training keeps them)");
}

ReshardStats ExpertReshard::to_generation() {
  HF_CHECK(!generating_, "ExpertReshard::to_generation: already in the generation layout");
  const auto start = std::chrono::steady_clock::now();
  ReshardStats stats;
  stats.mode = in_place() ? "experts-in-place" : "experts-allgather";
  int64_t own = 0;
  for (const auto& item : train_->named_parameters())
    (is_expert_parameter_name(item.key()) ? own : stats.replicated_bytes) += item.value().nbytes();
  if (in_place()) {
    // The training shards are the generation shards: used in place, nothing moves.
    stats.expert_model_bytes = own * train_->expert_parallel().size();
    stats.expert_peak_extra_weight_bytes = own;
  } else {
    const ExpertGather moved = train_->gather_experts();
    stats.expert_model_bytes = moved.expert_bytes;
    stats.expert_bytes_sent = moved.bytes_sent;
    stats.expert_bytes_received = moved.bytes_received;
    stats.expert_peak_extra_weight_bytes = moved.expert_bytes;
    stats.expert_redundant_bytes = moved.redundant_bytes;
  }
  if (train_->pipeline_stage().enabled()) {  // this stage's experts so far; the model's are every stage's
    const auto options = torch::TensorOptions().dtype(torch::kDouble).device(train_->parameters().front().device());
    auto bytes = torch::tensor({static_cast<double>(stats.expert_model_bytes)}, options);
    stages_->all_reduce(bytes, ReduceOp::kSum);
    stats.expert_model_bytes = static_cast<int64_t>(bytes.item<double>());
  }
  stats.bytes_sent = stats.expert_bytes_sent;
  stats.bytes_received = stats.expert_bytes_received;
  stats.peak_extra_weight_bytes = stats.expert_peak_extra_weight_bytes;
  stats.redundant_bytes = stats.expert_redundant_bytes;
  generating_ = true;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

ReshardStats ExpertReshard::to_training() {
  HF_CHECK(generating_, "ExpertReshard::to_training: not in the generation layout");
  const auto start = std::chrono::steady_clock::now();
  ReshardStats stats;
  stats.mode = in_place() ? "experts-in-place" : "experts-allgather";
  train_->release_gathered_experts();
  generating_ = false;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

}  // namespace hybridflow
