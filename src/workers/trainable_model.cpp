#include "hybridflow/workers/trainable_model.h"

#include "hybridflow/core/error.h"
#include "hybridflow/workers/checkpoint_io.h"
#include "hybridflow/workers/model_spec.h"

namespace hybridflow {

TrainableModel::TrainableModel(const WorkerContext& context, torch::Device device, const RoleProcessGroups* groups,
                               const ModelSpec& spec, HeadKind head, const TrainSpec& train)
    : role_(context.role), coord_(context.coord), groups_(groups) {
  model_ = groups_ ? build_model(spec, head, groups_->tensor_parallel(), groups_->pipeline_stage())
                   : build_model(spec, head);
  HF_CHECK(spec.expert_model_parallel_size == 1 || groups_, spec.expert_key, " = ", spec.expert_model_parallel_size,
           " needs as many processes; role '", role_, "' has one");
  // Expert parallelism: the experts split before the engine and the data-parallel broadcast see the parameters.
  if (groups_)
    experts_ = ExpertParallelRanks::join(groups_->world(), coord_, spec.expert_model_parallel_size, spec.expert_key);
  if (experts_) experts_->split(model_);
  if (groups_) pipeline_ = groups_->pipeline_runner(model_);
  engine_ = std::make_unique<TrainEngine>(model_.ptr(), train.optim);
  offload_ = RoleOffload(train.param_offload, train.optimizer_offload, device, role_);
  use_model_layout(*engine_, model_, pipeline_);
  if (groups_)
    dp_ = DataParallel::join(groups_->data_parallel(), role_, *model_, *engine_, train.use_distributed_optimizer,
                             experts_ != nullptr && !model_->experts_follow_tensor_parallel());
  if (experts_) experts_->use_in(*engine_);
}

DataProto TrainableModel::update(const DataProto& in, const MiniBatchPlan& plan, const MicroLossFn& loss_fn,
                                 const std::string& prefix, MetricAverager& metrics, const std::string& what) {
  if (dp_) dp_->check_same_rows(in.batch_size(), what);
  model_->train();
  offload_.load_optimizer(*engine_);
  const int64_t exchanged = experts_ ? experts_->all_to_all_bytes() : 0;
  MiniBatchPlan agreed = plan;
  // Micro-batches by token count differ in number between ranks; expert-parallel ranks run their group's most.
  if (experts_ && plan.max_token_len > 0)
    agreed.agree_micro_batches = [this](int64_t count) { return experts_->largest(count); };
  run_ppo_epochs(*engine_, in, agreed, loss_fn, "response_mask", prefix, metrics);
  offload_.offload_optimizer(*engine_);
  // Expert parallelism: the megabytes this rank's token exchanges (and their backward) sent in the update.
  if (experts_)
    metrics.add(prefix + "expert_parallel_all_to_all_mb",
                static_cast<double>(experts_->all_to_all_bytes() - exchanged) / (1 << 20));
  // The experts' weights this rank holds (1 / expert_model_parallel_size of them); gradients and AdamW's two
  // fp32 moments scale alike.
  if (model_->config().num_moe_layers() > 0) {
    int64_t bytes = 0;
    for (const auto& item : model_->named_parameters())
      if (is_expert_parameter_name(item.key())) bytes += item.value().numel() * item.value().element_size();
    metrics.add(prefix + "expert_parameter_mb", static_cast<double>(bytes) / (1 << 20));
  }
  // fp32 moments and masters this rank holds: 1/d of them with use_distributed_optimizer.
  metrics.add(prefix + "optimizer_state_bytes", static_cast<double>(engine_->optimizer_state_numel()) * 4);
  // One row per rank: the runtime's collect drops the meta of row-less outputs.
  DataProto out;
  out.set_tensor("update_rank", torch::full({1}, static_cast<int64_t>(coord_.rank), torch::kLong));
  out.meta()["metrics"] = dp_ ? dp_->metrics(metrics, prefix) : metrics.to_json();
  if (dp_) out.meta()["comm"] = dp_->comm_stats();
  return out;
}

DataProto TrainableModel::parameter_norm() {
  ParamsOnDevice on(offload_, *model_);
  DataProto out;
  out.set_tensor("param_sq_norm",
                 torch::full({1}, parameter_sq_norm(model_, groups_ ? groups_->pipeline() : nullptr), torch::kDouble));
  return out;
}

DataProto TrainableModel::flat_parameters() {
  ParamsOnDevice on(offload_, *model_);
  return hybridflow::flat_parameters(*model_);
}

DataProto TrainableModel::save_checkpoint(const DataProto& in) {
  HF_CHECK(in.meta().contains("dir") && in.meta().contains("tokenizer"),
           "save_checkpoint: meta 'dir' and 'tokenizer' (path of tokenizer.json) are required");
  ParamsOnDevice on(offload_, *model_);
  save_role_checkpoint(in.meta().at("dir").get<std::string>(), role_, coord_, model_, *engine_,
                       in.meta().at("tokenizer").get<std::string>(), groups_ ? groups_->pipeline() : nullptr);
  return DataProto();
}

DataProto TrainableModel::load_checkpoint(const DataProto& in, const std::function<void()>& refresh) {
  HF_CHECK(in.meta().contains("dir"), "load_checkpoint: meta 'dir' is required");
  ParamsOnDevice on(offload_, *model_);
  load_role_checkpoint(in.meta().at("dir").get<std::string>(), role_, coord_, model_, *engine_);
  if (refresh) refresh();
  return DataProto();
}

DataProto TrainableModel::save_lora_adapter(const DataProto& in) {
  HF_CHECK(in.meta().contains("dir"), "save_lora_adapter: meta 'dir' is required");
  ParamsOnDevice on(offload_, *model_);
  save_role_lora_adapter(in.meta().at("dir").get<std::string>(), coord_, model_, in.meta().value("base", std::string()),
                         groups_ ? groups_->pipeline() : nullptr);
  return DataProto();
}

}  // namespace hybridflow
