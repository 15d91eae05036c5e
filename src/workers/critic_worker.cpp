#include "hybridflow/workers/critic_worker.h"

#include <ATen/Parallel.h>

#include "hybridflow/algo/losses.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/logging.h"
#include "hybridflow/engine/packed_rows.h"
#include "hybridflow/runtime/protocol.h"
#include "hybridflow/workers/expert_parallel_ranks.h"
#include "hybridflow/workers/model_spec.h"
#include "hybridflow/workers/ppo_epochs.h"
#include "hybridflow/workers/rl_batch.h"

namespace hybridflow {

void CriticWorker::register_methods(MethodTable& table) {
  const nlohmann::json& config = context().config;
  at::set_num_threads(config.value("threads", 1));
  spec_ = decode_spec<CriticSpec>(config, "critic");
  const ModelSpec spec = config.at("model").get<ModelSpec>();
  set_device(model_device(spec));
  if (world_size() > 1) groups_ = RoleProcessGroups::connect(context(), device());
  trainable_ = std::make_unique<TrainableModel>(context(), device(), groups_.get(), spec, HeadKind::kValue, spec_.train);
  remove_padding_ = spec.use_remove_padding;
  const int sp_size = spec.ulysses_sequence_parallel_size;
  HF_CHECK(sp_size == 1 || groups_, "critic.ulysses_sequence_parallel_size = ", sp_size, " needs as many processes; role '",
           context().role, "' has one");
  if (groups_)
    sequence_parallel_ =
        SequenceParallelRows::join(groups_->world(), coord(), sp_size, "critic.ulysses_sequence_parallel_size");
  if (sequence_parallel_) {  // the model refuses a head count or layout it cannot split: at creation, not mid-run
    trainable_->model()->set_sequence_parallel(sequence_parallel_->group());
    trainable_->model()->set_sequence_parallel({});
  }
  table.add("compute_values", batch_protocol(coord()), this, &CriticWorker::compute_values);
  table.add("update_critic", batch_protocol(coord()), this, &CriticWorker::update_critic);
  table.add("parameter_norm", protocols::kOneToAll, this, &CriticWorker::parameter_norm);
  table.add("flat_parameters", protocols::kOneToAll, this, &CriticWorker::flat_parameters);
  table.add("save_checkpoint", protocols::kOneToAll, this, &CriticWorker::save_checkpoint);
  table.add("load_checkpoint", protocols::kOneToAll, this, &CriticWorker::load_checkpoint);
  table.add("save_lora_adapter", protocols::kOneToAll, this, &CriticWorker::save_lora_adapter);
  table.add("memory_stats", protocols::kOneToAll, this, &CriticWorker::memory_stats);
  trainable_->offload_params();
}

DataProto CriticWorker::memory_stats(const DataProto&) { return memory_stats_row(); }

torch::Tensor CriticWorker::response_values(const DataProto& m) {
  const auto& ids = m.tensor("input_ids");
  const int64_t response_len = m.tensor("responses").size(1);
  const int64_t prompt_len = ids.size(1) - response_len;
  HF_CHECK(prompt_len > 0, "critic: input_ids ", ids.sizes(), " hold no prompt before ", response_len,
           " response tokens");
  auto values = remove_padding_ ? packed_values(trainable_->model(), ids, m.tensor("attention_mask"))
                                : trainable_->model()->forward(ids, m.tensor("attention_mask")).values;  // [B, T]
  // The value of the state that emits response token r sits at position P + r - 1.
  return values.slice(1, prompt_len - 1, prompt_len - 1 + response_len) * m.tensor("response_mask").to(torch::kFloat);
}

DataProto CriticWorker::compute_values(const DataProto& in) {
  auto on = trainable_->params_on_device();
  torch::NoGradGuard no_grad;
  trainable_->model()->eval();
  // Under expert parallelism the pass runs on every expert, gathered for it: the ranks' micro-batches need no
  // lockstep (as the actor's log-prob passes).
  ExpertsGathered gathered({&trainable_->model()});
  return on_sequence_parallel_rows(sequence_parallel_.get(), {&trainable_->model()}, in, [&](const DataProto& rows) {
    torch::Tensor values = forward_micro_batches(trainable_->pipeline(), rows, spec_.values,
                                                 [&](const DataProto& m) { return response_values(m); });
    DataProto out;
    if (values.defined()) out.set_tensor("values", values.contiguous());  // the last pipeline stage's
    return out;
  });
}

DataProto CriticWorker::update_critic(const DataProto& in) {
  return update_on_sequence_parallel_rows(sequence_parallel_.get(), {&trainable_->model()}, in, "critic/",
                                          [&](const DataProto& rows) { return update_critic_rows(rows); });
}

DataProto CriticWorker::update_critic_rows(const DataProto& in) {
  auto on = trainable_->params_on_device();
  const double cliprange = spec_.cliprange_value;
  const algo::LossAggMode agg = spec_.loss_agg_mode;
  // seq-mean-token-sum-norm divides by the batch's response width, also in a micro-batch cut to its own.
  const double response_width = static_cast<double>(in.tensor("response_mask").size(1));
  MetricAverager metrics;
  auto loss_fn = [&](const DataProto& m) {
    const auto mask = m.tensor("response_mask").to(torch::kFloat);
    auto vpreds = response_values(m);
    auto vl = algo::clipped_value_loss(vpreds, m.tensor("values"), m.tensor("returns"), mask, cliprange, agg,
                                       response_width);
    metrics.add("critic/vf_loss", vl.loss.item<double>());
    metrics.add("critic/vf_clipfrac", vl.clip_frac.item<double>());
    metrics.add("critic/vpred_mean", algo::masked_mean(vpreds.detach(), mask).item<double>());
    return vl.loss;
  };
  MiniBatchPlan plan = mini_batch_plan(spec_.train, in.meta());
  plan.weighting = loss_weighting_for(agg);
  plan.max_token_len_key = "critic.ppo_max_token_len_per_gpu";
  return trainable_->update(in, plan, loss_fn, "critic/", metrics, "update_critic");
}

DataProto CriticWorker::parameter_norm(const DataProto&) { return trainable_->parameter_norm(); }

DataProto CriticWorker::flat_parameters(const DataProto&) { return trainable_->flat_parameters(); }

DataProto CriticWorker::save_checkpoint(const DataProto& in) { return trainable_->save_checkpoint(in); }

DataProto CriticWorker::load_checkpoint(const DataProto& in) { return trainable_->load_checkpoint(in); }

DataProto CriticWorker::save_lora_adapter(const DataProto& in) { return trainable_->save_lora_adapter(in); }

void RewardModelWorker::register_methods(MethodTable& table) {
  const nlohmann::json& config = context().config;
  at::set_num_threads(config.value("threads", 1));
  spec_ = decode_spec<ScoringModelSpec>(config, "scoring");
  const ModelSpec spec = config.at("model").get<ModelSpec>();
  set_device(model_device(spec));
  // Only a split model needs process groups: scoring data-parallel ranks never talk to each other.
  if (coord().tp_size > 1 || coord().pp_size > 1) groups_ = RoleProcessGroups::connect(context(), device());
  model_ = groups_ ? build_model(spec, HeadKind::kValue, groups_->tensor_parallel(), groups_->pipeline_stage())
                   : build_model(spec, HeadKind::kValue);
  // A mixture of experts split over tensor-parallel ranks folds its experts over them, as an actor does at
  // expert_model_parallel_size = tp: each rank holds 1/t of them and one all-reduce per sparse layer sums the
  // parts (the ranks score in step anyway).
  const ModelConfig& c = model_->config();
  if (groups_ && groups_->tensor_parallel().enabled() && c.num_moe_layers() > 0) {
    if (c.moe.num_experts % coord().tp_size == 0)
      model_->set_expert_parallel(ExpertParallelGroup(groups_->tensor_parallel().comm()), /*over_tensor_parallel=*/true);
    else if (rank() == 0)  // correct either way; the memory is what differs
      log_warn("role '", context().role, "': its ", c.moe.num_experts, " experts do not fold over its ", coord().tp_size,
               " tensor-parallel ranks, so each rank holds all of them; a tensor_model_parallel_size that divides ",
               c.moe.num_experts, " holds 1/tp of them");
  }
  if (groups_) pipeline_ = groups_->pipeline_runner(model_);
  model_->eval();
  table.add("compute_rm_score", batch_protocol(coord()), this, &RewardModelWorker::compute_rm_score);
  table.add("memory_stats", protocols::kOneToAll, this, &RewardModelWorker::memory_stats);
}

DataProto RewardModelWorker::memory_stats(const DataProto&) { return memory_stats_row(); }

DataProto RewardModelWorker::compute_rm_score(const DataProto& in) {
  torch::NoGradGuard no_grad;
  torch::Tensor scores = forward_micro_batches(pipeline_.get(), in, spec_.forward, [&](const DataProto& m) {
    const auto& mask = m.tensor("attention_mask");
    auto values = model_->forward(m.tensor("input_ids"), mask).values;
    return values.gather(1, last_valid_index(mask).unsqueeze(1)).squeeze(1);
  });
  DataProto out;
  if (scores.defined()) out.set_tensor("rm_scores", scores.to(torch::kFloat).contiguous());  // the last stage's
  return out;
}

}  // namespace hybridflow
