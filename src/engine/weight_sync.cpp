#include "hybridflow/engine/weight_sync.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <tuple>

#include "hybridflow/core/error.h"
#include "hybridflow/model/lora.h"
#include "hybridflow/model/pipeline_layout.h"
#include "hybridflow/model/tensor_parallel_layout.h"
#include "hybridflow/parallel/tensor_parallel.h"

namespace hybridflow {

namespace {

int axis_of(ShardDim dim) { return dim == ShardDim::kRows ? 0 : dim == ShardDim::kColumns ? 1 : -1; }

int64_t slice_numel(const std::vector<int64_t>& shape, int axis, int64_t length) {
  int64_t n = 1;
  for (size_t d = 0; d < shape.size(); ++d) n *= static_cast<int>(d) == axis ? length : shape[d];
  return n;
}

// Where this rank's shard of `name` starts along `axis` in the full tensor (0 for a replicated weight).
int64_t shard_start(const std::string& name, const ModelConfig& config, int tp, int tp_rank, int axis,
                    int64_t full_length) {
  if (axis < 0 || shard_dim(name, config, tp) == ShardDim::kReplicated) return 0;
  return even_partition(full_length, tp, tp_rank, name).start;
}

// The buckets this rank sends (or receives), each with its tag: the bucket's index among those of its
// (src, dst) pair, which both sides number alike even when a sender's plan holds only its own stage's
// weights. Plan order sorts by (src, dst), so every rank meets its transfers in one global order (the
// smallest pending transfer can always complete: no cycle of waits).
std::vector<std::pair<int, const WeightBucket*>> my_buckets(const std::vector<WeightBucket>& buckets, int rank,
                                                             bool sending) {
  std::vector<std::pair<int, const WeightBucket*>> out;
  int tag = 0;
  for (size_t i = 0; i < buckets.size(); ++i) {
    const bool same_pair = i > 0 && buckets[i - 1].src == buckets[i].src && buckets[i - 1].dst == buckets[i].dst;
    tag = same_pair ? tag + 1 : 0;
    if ((sending ? buckets[i].src : buckets[i].dst) == rank) out.emplace_back(tag, &buckets[i]);
  }
  return out;
}

}  // namespace

std::vector<WeightPiece> weight_sync_plan(const std::map<std::string, std::vector<int64_t>>& full_shapes,
                                          const ModelConfig& config, const WeightSyncLayout& l) {
  HF_CHECK(l.actor_tp >= 1 && l.actor_dp >= 1 && l.actor_pp >= 1 && l.rollout_tp >= 1 && l.rollout_replicas >= 1,
           "weight sync: every layout size must be >= 1");
  std::vector<WeightPiece> plan;
  for (const auto& [name, shape] : full_shapes) {
    const ShardDim actor_dim = shard_dim(name, config, l.actor_tp);
    const ShardDim rollout_dim = shard_dim(name, config, l.rollout_tp);
    // Both layouts split a weight along the same axis (the name decides it); either may replicate it.
    const int axis = actor_dim != ShardDim::kReplicated ? axis_of(actor_dim) : axis_of(rollout_dim);
    HF_CHECK(axis < static_cast<int>(shape.size()), "weight sync: '", name, "' has ", shape.size(),
             " dimensions but is split along axis ", axis);
    const int64_t length = axis >= 0 ? shape[axis] : 0;
    const int stage = owning_stage(name, config, l.actor_pp);
    for (int replica = 0; replica < l.rollout_replicas; ++replica) {
      const int src_dp = replica % l.actor_dp;
      for (int j = 0; j < l.rollout_tp; ++j) {
        WeightPiece piece;
        piece.name = name;
        piece.axis = axis;
        piece.dst = l.rollout_rank(j, replica);
        if (axis < 0) {  // replicated in both layouts: the whole tensor from the replica's first tp rank
          piece.src = l.actor_rank(0, src_dp, stage);
          piece.numel = slice_numel(shape, -1, 0);
          plan.push_back(piece);
          continue;
        }
        const Partition need = rollout_dim == ShardDim::kReplicated ? Partition{0, length}
                                                                    : even_partition(length, l.rollout_tp, j, name);
        if (actor_dim == ShardDim::kReplicated) {  // every actor tp rank holds it whole: spread the senders
          piece.src = l.actor_rank(j % l.actor_tp, src_dp, stage);
          piece.begin = need.start;
          piece.end = need.start + need.length;
          piece.numel = slice_numel(shape, axis, need.length);
          plan.push_back(piece);
          continue;
        }
        for (int i = 0; i < l.actor_tp; ++i) {
          const Partition have = even_partition(length, l.actor_tp, i, name);
          const int64_t begin = std::max(need.start, have.start);
          const int64_t end = std::min(need.start + need.length, have.start + have.length);
          if (begin >= end) continue;
          WeightPiece part = piece;
          part.src = l.actor_rank(i, src_dp, stage);
          part.begin = begin;
          part.end = end;
          part.numel = slice_numel(shape, axis, end - begin);
          plan.push_back(part);
        }
      }
    }
  }
  std::sort(plan.begin(), plan.end(), [](const WeightPiece& a, const WeightPiece& b) {
    return std::tie(a.src, a.dst, a.name, a.begin) < std::tie(b.src, b.dst, b.name, b.begin);
  });
  return plan;
}

std::vector<WeightBucket> weight_sync_buckets(const std::vector<WeightPiece>& plan, int64_t bucket_bytes,
                                              int64_t element_size) {
  HF_CHECK(bucket_bytes > 0 && element_size > 0, "weight sync: bucket and element sizes must be > 0");
  std::vector<WeightBucket> buckets;
  for (size_t i = 0; i < plan.size(); ++i) {
    const WeightPiece& p = plan[i];
    const bool same_pair = !buckets.empty() && buckets.back().src == p.src && buckets.back().dst == p.dst;
    if (!same_pair || (buckets.back().numel + p.numel) * element_size > bucket_bytes) {
      WeightBucket b;
      b.src = p.src;
      b.dst = p.dst;
      buckets.push_back(b);
    }
    buckets.back().pieces.push_back(i);
    buckets.back().numel += p.numel;
  }
  return buckets;
}

std::map<std::string, std::vector<int64_t>> full_weight_shapes(const CausalLM& model, int tp) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& item : model->named_parameters()) {
    std::vector<int64_t> shape(item.value().sizes().begin(), item.value().sizes().end());
    const int axis = axis_of(shard_dim(item.key(), model->config(), tp));
    if (axis >= 0 && axis < static_cast<int>(shape.size())) shape[axis] *= tp;
    shapes[item.key()] = shape;
  }
  // Gathered experts (each whole on this rank): the other ranks' too.
  if (model->experts_gathered())
    for (const auto& [name, weight] : model->gathered_expert_weights()) shapes[name] = weight.sizes().vec();
  return shapes;
}

std::map<std::string, std::vector<int64_t>> synced_weight_shapes(const CausalLM& model, int tp) {
  auto shapes = full_weight_shapes(model, tp);
  if (!model->has_lora()) return shapes;
  std::erase_if(shapes, [](const auto& item) { return !is_lora_parameter_name(item.first); });
  return shapes;
}

WeightSync::WeightSync(ProcessGroup world, WeightSyncLayout layout, int64_t bucket_bytes, at::ScalarType dtype)
    : world_(std::move(world)), layout_(layout), bucket_bytes_(bucket_bytes), dtype_(dtype) {
  HF_CHECK(world_.valid() && world_.size() == layout_.world(), "weight sync: the group has ",
           world_.valid() ? world_.size() : 0, " ranks but the layouts need ", layout_.world());
  HF_CHECK(bucket_bytes_ > 0, "weight sync: the bucket size must be > 0, got ", bucket_bytes_);
}

WeightSyncStats WeightSync::send(const CausalLM& actor) {
  const auto start = std::chrono::steady_clock::now();
  const int rank = world_.rank();
  HF_CHECK(rank < layout_.actor_world(), "weight sync: rank ", rank, " is a rollout rank, not an actor rank");
  const ModelConfig& config = actor->config();
  const auto plan = weight_sync_plan(synced_weight_shapes(actor, layout_.actor_tp), config, layout_);
  const auto buckets = weight_sync_buckets(plan, bucket_bytes_, c10::elementSize(dtype_));
  const int tp_rank = rank % layout_.actor_tp;
  std::map<std::string, torch::Tensor> params;
  for (const auto& item : actor->named_parameters()) params.emplace(item.key(), item.value());
  if (actor->experts_gathered()) params.merge(actor->gathered_expert_weights());  // own ones are already in
  auto find = [&](const std::string& name) -> const torch::Tensor* {
    auto it = params.find(name);
    return it == params.end() ? nullptr : &it->second;
  };
  WeightSyncStats stats;
  std::deque<ProcessGroup::PendingSend> in_flight;  // two buckets at most: bounded memory, sends overlap packing
  torch::NoGradGuard no_grad;
  for (const auto& [tag, bucket] : my_buckets(buckets, rank, /*sending=*/true)) {
    const torch::Tensor* any = find(plan[bucket->pieces.front()].name);
    HF_CHECK(any != nullptr, "weight sync: the actor holds no '", plan[bucket->pieces.front()].name, "'");
    torch::Tensor flat = torch::empty({bucket->numel}, any->options().dtype(dtype_));
    int64_t at = 0;
    for (size_t p : bucket->pieces) {
      const WeightPiece& piece = plan[p];
      const torch::Tensor* param = find(piece.name);
      HF_CHECK(param != nullptr, "weight sync: the actor holds no '", piece.name, "'");
      torch::Tensor slice = *param;
      if (piece.axis >= 0) {
        const int64_t full = param->size(piece.axis) *
                             (shard_dim(piece.name, config, layout_.actor_tp) == ShardDim::kReplicated ? 1 : layout_.actor_tp);
        const int64_t offset = piece.begin - shard_start(piece.name, config, layout_.actor_tp, tp_rank, piece.axis, full);
        slice = slice.narrow(piece.axis, offset, piece.end - piece.begin);
      }
      flat.narrow(0, at, piece.numel).copy_(slice.reshape({-1}));
      at += piece.numel;
    }
    if (in_flight.size() >= 2) {
      in_flight.front().wait();
      in_flight.pop_front();
    }
    in_flight.push_back(world_.isend(flat, bucket->dst, tag));
    stats.bytes_sent += flat.nbytes();
    ++stats.buckets;
  }
  for (auto& pending : in_flight) pending.wait();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

int64_t WeightSync::announced_version() const {
  const std::string value = world_.store_value(kWeightSyncAnnounceKey);
  return value.empty() ? -1 : std::stoll(value);
}

bool WeightSync::pause_requested() const { return world_.store_value(kRolloutPauseKey) == "1"; }

std::string WeightSync::streamed_prompts(int64_t step) const {
  return world_.store_value(kRolloutStreamKeyPrefix + std::to_string(step));
}

WeightSyncStats WeightSync::receive(CausalLM& rollout) {
  const auto start = std::chrono::steady_clock::now();
  const int rank = world_.rank();
  HF_CHECK(rank >= layout_.actor_world(), "weight sync: rank ", rank, " is an actor rank, not a rollout rank");
  const ModelConfig& config = rollout->config();
  const auto plan = weight_sync_plan(synced_weight_shapes(rollout, layout_.rollout_tp), config, layout_);
  const auto buckets = weight_sync_buckets(plan, bucket_bytes_, c10::elementSize(dtype_));
  const int tp_rank = (rank - layout_.actor_world()) % layout_.rollout_tp;
  auto params = rollout->named_parameters();
  WeightSyncStats stats;
  torch::NoGradGuard no_grad;
  for (const auto& [tag, bucket] : my_buckets(buckets, rank, /*sending=*/false)) {
    const torch::Tensor* any = params.find(plan[bucket->pieces.front()].name);
    torch::Tensor flat = torch::empty({bucket->numel}, any->options().dtype(dtype_));
    world_.recv(flat, bucket->src, tag);
    stats.bytes_received += flat.nbytes();
    ++stats.buckets;
    int64_t at = 0;
    for (size_t p : bucket->pieces) {
      const WeightPiece& piece = plan[p];
      torch::Tensor target = *params.find(piece.name);
      if (piece.axis >= 0) {
        const int64_t full = target.size(piece.axis) *
                             (shard_dim(piece.name, config, layout_.rollout_tp) == ShardDim::kReplicated ? 1 : layout_.rollout_tp);
        const int64_t offset =
            piece.begin - shard_start(piece.name, config, layout_.rollout_tp, tp_rank, piece.axis, full);
        target = target.narrow(piece.axis, offset, piece.end - piece.begin);
      }
      target.copy_(flat.narrow(0, at, piece.numel).view(target.sizes()));
      at += piece.numel;
    }
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

}  // namespace hybridflow
