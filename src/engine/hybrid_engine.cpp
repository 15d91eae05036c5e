#include "hybridflow/engine/hybrid_engine.h"

#include <algorithm>
#include <chrono>

#include "hybridflow/core/error.h"
#include "hybridflow/model/lora.h"
#include "hybridflow/model/model_size.h"
#include "hybridflow/model/pipeline_layout.h"
#include "hybridflow/model/tensor_parallel_layout.h"

namespace hybridflow {
namespace {

// Index of the group that holds `rank`, and the rank's position in it.
std::pair<int, int> position_in(const std::vector<std::vector<int>>& groups, int rank) {
  for (size_t g = 0; g < groups.size(); ++g) {
    auto it = std::find(groups[g].begin(), groups[g].end(), rank);
    if (it != groups[g].end()) return {static_cast<int>(g), static_cast<int>(it - groups[g].begin())};
  }
  HF_FAIL("HybridEngine: rank ", rank, " is in no group of the layout");
}

void point_at(torch::Tensor& param, const torch::Tensor& source) {
  torch::NoGradGuard no_grad;
  param.set_(source);
}

void release(torch::Tensor& param) { point_at(param, torch::empty({0}, param.options())); }

int64_t gathered_bytes(const Communicator& comm) { return comm.stats().of("all_gather").bytes; }

// The index e of an expert's parameter ("...mlp.experts.<e>.<projection>.weight").
int64_t expert_index(const std::string& name) {
  const std::string marker = ".experts.";
  const size_t at = name.find(marker) + marker.size();
  return std::stoll(name.substr(at, name.find('.', at) - at));
}

}  // namespace

struct HybridEngine::Weight {
  std::string name;
  torch::Tensor train;      // the training model's parameter (the same tensor the optimizer steps); undefined
                            // when another pipeline stage holds it
  torch::Tensor gen;        // the generation model's parameter
  std::vector<int64_t> gen_shape;
  ShardDim train_dim = ShardDim::kReplicated;
  ShardDim gen_dim = ShardDim::kReplicated;
  int stage = 0;            // the training pipeline stage that owns it
  bool tied_copy = false;   // the generation model's last-stage copy of a tied embedding (gen pp > 1)
  int expert_piece = -1;    // experts folded over the tensor-parallel ranks: the micro-DP piece (training
                            // tensor rank % k) whose rank holds this expert whole
  bool split_expert = false;  // an expert of an actor whose experts are split any other way: whole on every
                              // rank of its stage once gathered there (never a training parameter here)
  torch::Tensor gathered;   // while generating: the generation tensor (hybridflow) or the full tensor, when
                            // the switch allocated it
};

HybridEngine::HybridEngine(CausalLM train, const GenerationLayout& layout, const ProcessGroup& world,
                           ReshardMode mode)
    : train_(std::move(train)), layout_(layout), mode_(mode), world_rank_(world.rank()) {
  const DeviceMesh& mesh = layout_.train();
  HF_CHECK(world.size() == mesh.world_size(), "HybridEngine: the actor's world has ", world.size(),
           " ranks but the training layout ", mesh.to_string(), " needs ", mesh.world_size());
  HF_CHECK(layout_.gen_pp() == 1 || mode_ == ReshardMode::kHybridFlow, "HybridEngine: generation in pipeline ",
           "stages (generation pp ", layout_.gen_pp(), ") is built for reshard mode hybridflow, not ",
           reshard_mode_name(mode_), "; the baselines generate unstaged (generation pp 1)");
  const PipelineStage stage = train_->pipeline_stage();
  HF_CHECK(stage.stages == mesh.pp() && stage.stage == mesh.coords(world_rank_).pp, "HybridEngine: the training ",
           "model is pipeline stage ", stage.stage, " of ", stage.stages, " but rank ", world_rank_, " of ",
           mesh.to_string(), " is stage ", mesh.coords(world_rank_).pp, " of ", mesh.pp());
  HF_CHECK(train_->head_kind() == HeadKind::kLanguageModel, "HybridEngine: the actor needs a language-model head");
  const int t = mesh.tp();
  HF_CHECK(train_->tensor_parallel().size() == t, "HybridEngine: the training model is split over ",
           train_->tensor_parallel().size(), " ranks but the layout says tp=", t);
  switch (mode_) {
    case ReshardMode::kHybridFlow:
      gather_comm_ = std::make_unique<Communicator>(world.split(layout_.micro_dp_groups()));
      break;
    case ReshardMode::kHybridFlowV:
      gather_comm_ = std::make_unique<Communicator>(world.split(mesh.model_parallel_groups()));
      break;
    case ReshardMode::kAllGather:
      gather_comm_ = std::make_unique<Communicator>(world);
      break;
  }
  const auto gen_groups =
      mode_ == ReshardMode::kHybridFlowV ? vanilla_generation_tp_groups(layout_) : layout_.gen_tp_groups();
  if (mode_ == ReshardMode::kHybridFlowV) {
    std::tie(gen_replica_, gen_tp_rank_) = position_in(gen_groups, world_rank_);
    gen_replicas_ = static_cast<int>(gen_groups.size());
  } else {
    // The layout's coordinates, which the controller splits prompts by; with stages the replica is not the
    // index of its group (groups are listed by their first rank).
    const GenCoords g = layout_.coords(world_rank_);
    gen_replica_ = g.dp;
    gen_tp_rank_ = g.tp;
    gen_replicas_ = layout_.gen_dp();
  }
  gen_tp_comm_ = std::make_unique<Communicator>(world.split(gen_groups));
  gen_group_ = TensorParallelGroup(gen_tp_comm_.get());
  PipelineStage gen_stage;
  if (layout_.gen_pp() > 1) {
    gen_stage = PipelineStage{layout_.coords(world_rank_).pp, layout_.gen_pp()};
    gen_pp_comm_ = std::make_unique<Communicator>(world.split(layout_.gen_pp_groups()));
  }

  // Experts folded over the training tensor-parallel ranks (one replica's: CausalLM::experts_follow_tensor_parallel)
  // fold over the generation ones the same way. Generation tensor rank q's experts are the training blocks of
  // tensor ranks qk .. qk + k - 1, the k pieces of its micro-DP group in each stage, so each comes whole from
  // one of them. Experts split any other way have owners outside the micro-DP group: they are gathered in
  // their stage first (CausalLM::gather_experts, over the expert-parallel group), after which every rank of the
  // stage holds each whole, as it holds a norm, and they travel as the norms do; the generation model folds
  // them over its tensor ranks too (or, at t_g = 1, holds them all).
  const ExpertParallelGroup& train_ep = train_->expert_parallel();
  HF_CHECK(!train_ep.enabled() || mode_ == ReshardMode::kHybridFlow, "HybridEngine: an actor with its experts ",
           "split (expert_model_parallel_size ", train_ep.size(), ") switches layouts in reshard mode hybridflow, ",
           "not ", reshard_mode_name(mode_));
  const int64_t num_experts = train_->config().moe.num_experts;
  HF_CHECK(!experts_split() || num_experts % layout_.gen_tp() == 0, "HybridEngine: the actor's ", num_experts,
           " experts do not fold over the generation's ", layout_.gen_tp(), " tensor-parallel ranks; choose a ",
           "rollout tensor_model_parallel_size that divides them");
  // The generation model's structure only: its parameters point at gathered weights while generating.
  const torch::Tensor first = train_->parameters().front();
  generation_ = CausalLM(train_->config(), HeadKind::kLanguageModel, gen_group_, gen_stage);
  generation_->to(first.device(), first.scalar_type());
  if (experts_folded() || (experts_split() && layout_.gen_tp() > 1))
    generation_->set_expert_parallel(ExpertParallelGroup(gen_tp_comm_.get()), true);
  auto train_params = train_->named_parameters();
  auto gen_params = generation_->named_parameters();
  // LoRA adapters stay with the training model: the generation model takes the weights with them merged in.
  // Split experts differ in number between the layouts (num_experts / n against / t_g).
  auto counted = [&](const std::string& name) {
    return !is_lora_parameter_name(name) && !(train_ep.enabled() && is_expert_parameter_name(name));
  };
  const auto base_params =
      std::count_if(train_params.begin(), train_params.end(), [&](const auto& item) { return counted(item.key()); });
  const auto gen_base =
      std::count_if(gen_params.begin(), gen_params.end(), [&](const auto& item) { return counted(item.key()); });
  HF_CHECK(stage.enabled() || base_params == gen_base, "HybridEngine: the layouts' models differ in parameters");
  const int k = t / layout_.gen_tp();
  const int64_t experts_per_train_rank = num_experts / t;
  // The last training stage's copy of a tied embedding: the same values as the first stage's weight.
  const torch::Tensor* train_tied_copy =
      stage.enabled() && !stage.first() ? train_params.find("model.embed_tokens.weight") : nullptr;
  for (const auto& item : gen_params) {
    Weight w;
    w.name = item.key();
    w.stage = owning_stage(w.name, train_->config(), mesh.pp());
    // A generation stage after the first holds the embedding only as the tied head's copy: it comes from the
    // last training stage's copy, which is in the same generation stage.
    w.tied_copy = gen_stage.enabled() && !gen_stage.first() && w.name == "model.embed_tokens.weight";
    if (w.tied_copy) w.stage = mesh.pp() - 1;
    if (experts_folded() && is_expert_parameter_name(w.name))
      w.expert_piece = static_cast<int>(expert_index(w.name) / experts_per_train_rank % k);
    w.split_expert = experts_split() && is_expert_parameter_name(w.name);
    if (w.stage == stage.stage && !w.split_expert) {
      const torch::Tensor* train = w.tied_copy ? train_tied_copy : train_params.find(w.name);
      // A folded expert is held by one piece of the stage.
      HF_CHECK(train != nullptr || w.expert_piece >= 0, "HybridEngine: the training model has no '", w.name, "'");
      if (train != nullptr) w.train = *train;
    }
    w.gen = item.value();
    w.gen_shape = w.gen.sizes().vec();
    w.train_dim = shard_dim(w.name, train_->config(), t);
    w.gen_dim = shard_dim(w.name, train_->config(), layout_.gen_tp());
    release(w.gen);
    weights_.push_back(std::move(w));
  }
  // Generating unstaged, the training copy becomes a slice of the one gathered embedding (gather_stages).
  if (!gen_stage.enabled() && train_tied_copy != nullptr) tied_copy_ = *train_tied_copy;
}

HybridEngine::~HybridEngine() = default;

CausalLM& HybridEngine::generation_model() {
  HF_CHECK(generating_, "HybridEngine: the generation model exists only between to_generation() and to_training()");
  return generation_;
}

void HybridEngine::gather_in_place(Weight& w, ReshardStats& stats) {
  const int k = gather_comm_->size();
  if (k == 1) {  // t_g == t: the training shard is the generation shard
    point_at(w.gen, w.train);
    stats.peak_extra_weight_bytes += w.train.nbytes();
    return;
  }
  const int m = gather_comm_->rank();
  torch::Tensor shard = w.train.detach();
  // Rows stack as they are; a column split gathers to [k, out, in / k], which the model uses as it is.
  torch::Tensor gathered = gather_comm_->all_gather_cat(shard.contiguous(), 0);
  torch::Tensor mine;
  if (w.train_dim == ShardDim::kRows) {
    mine = gathered.narrow(0, m * shard.size(0), shard.size(0));
  } else {
    gathered = gathered.view({k, shard.size(0), shard.size(1)});
    mine = gathered.select(0, m);
  }
  point_at(w.train, mine);  // the old training storage is freed here
  point_at(w.gen, gathered);
  w.gathered = gathered;
  stats.peak_extra_weight_bytes += gathered.nbytes();
}

void HybridEngine::gather_full(Weight& w, ReshardStats& stats) {
  const int t = layout_.train().tp();
  torch::Tensor shard = w.train.detach().contiguous();
  torch::Tensor full;
  if (mode_ == ReshardMode::kHybridFlowV) {
    full = gather_comm_->all_gather_cat(shard, w.train_dim == ShardDim::kRows ? 0 : 1);
  } else {
    // DeepSpeed-Chat style: each data-parallel replica contributes 1/d of its shard; every rank gathers all.
    const int d = layout_.train().dp();
    const int e = layout_.train().coords(world_rank_).dp;
    const int64_t n = shard.numel();
    HF_CHECK(n % d == 0, "HybridEngine allgather: '", w.name, "' has ", n, " elements per shard, not divisible by dp=", d);
    auto pieces = gather_comm_->all_gather_cat(shard.reshape({-1}).narrow(0, e * n / d, n / d), 0);
    // World rank order is (dp, tp); regroup the pieces by tensor-parallel shard.
    auto sizes = shard.sizes().vec();
    sizes.insert(sizes.begin(), t);
    auto shards = pieces.view({d, t, n / d}).transpose(0, 1).contiguous().view(sizes);
    full = w.train_dim == ShardDim::kRows ? shards.flatten(0, 1) : shards.movedim(0, 1).flatten(1, 2).contiguous();
  }
  w.gathered = full;
  stats.peak_extra_weight_bytes += full.nbytes();
  point_at(w.gen, w.gen_dim == ShardDim::kReplicated ? full
                                                      : shard_of(full, w.gen_dim, gen_tp_rank_, layout_.gen_tp()));
}

ReshardStats HybridEngine::to_generation() {
  HF_CHECK(!generating_, "HybridEngine::to_generation: already in the generation layout");
  const auto start = std::chrono::steady_clock::now();
  ReshardStats stats;
  stats.mode = reshard_mode_name(mode_);
  // Folded experts from other pieces and split experts travel like the stages' weights (gather_stages), also
  // unstaged.
  if (layout_.train().pp() > 1 || (experts_folded() && layout_.gen_tp() < layout_.train().tp()) || experts_split()) {
    if (mode_ == ReshardMode::kHybridFlow)
      gather_stages_with_experts(stats);
    else
      gather_stages_whole(stats);
    generating_ = true;
    stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return stats;
  }
  const int t = layout_.train().tp();
  const int64_t before = gathered_bytes(*gather_comm_);
  for (auto& w : weights_) {
    if (w.train_dim == ShardDim::kReplicated) {
      // Norms (and k/v when replicated for training) need no communication; a generation split is a view.
      stats.replicated_bytes += w.train.nbytes();
      point_at(w.gen, w.gen_dim == ShardDim::kReplicated
                          ? w.train
                          : shard_of(w.train, w.gen_dim, gen_tp_rank_, layout_.gen_tp()));
      continue;
    }
    stats.model_bytes += w.train.nbytes() * t;
    if (mode_ == ReshardMode::kHybridFlow)
      gather_in_place(w, stats);
    else
      gather_full(w, stats);
    // Measured, not assumed: does the training parameter still own memory of its own?
    if (!w.train.storage().is_alias_of(w.gen.storage())) stats.redundant_bytes += w.train.nbytes();
  }
  const int64_t contributed = gathered_bytes(*gather_comm_) - before;
  stats.bytes_sent = stats.bytes_received = contributed * (gather_comm_->size() - 1);
  generating_ = true;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

ReshardStats HybridEngine::to_training() {
  HF_CHECK(generating_, "HybridEngine::to_training: not in the generation layout");
  const auto start = std::chrono::steady_clock::now();
  ReshardStats stats;
  stats.mode = reshard_mode_name(mode_);
  // A training shard that lives inside a generation tensor moves back into memory of its own.
  auto own_memory = [](torch::Tensor& train, const torch::Tensor& gathered) {
    if (train.defined() && gathered.defined() && train.storage().is_alias_of(gathered.storage()))
      point_at(train, train.detach().clone(at::MemoryFormat::Contiguous));
  };
  for (auto& w : weights_) {
    own_memory(w.train, w.gathered);
    if (w.name == "model.embed_tokens.weight") own_memory(tied_copy_, w.gathered);
    release(w.gen);
    w.gathered = torch::Tensor();
  }
  generating_ = false;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

void HybridEngine::gather_stages_with_experts(ReshardStats& stats) {
  if (!experts_split()) return gather_stages(stats);
  // The stage's experts, whole on each of its ranks for as long as their generation copies take to fill.
  const ExpertGather moved = train_->gather_experts();
  stage_experts_ = train_->gathered_expert_weights();
  gather_stages(stats);
  stage_experts_.clear();
  train_->release_gathered_experts();
  // Every expert of the model (all stages), as ExpertReshard reports it.
  stats.expert_model_bytes = static_cast<int64_t>(model_size(train_->config()).experts) *
                             static_cast<int64_t>(train_->parameters().front().element_size());
  stats.expert_bytes_sent = moved.bytes_sent;
  stats.expert_bytes_received = moved.bytes_received;
  stats.expert_peak_extra_weight_bytes = moved.expert_bytes;
  stats.bytes_sent += moved.bytes_sent;
  stats.bytes_received += moved.bytes_received;
  stats.peak_extra_weight_bytes += moved.expert_bytes;
}

void HybridEngine::gather_stages(ReshardStats& stats) {
  torch::NoGradGuard no_grad;
  // The micro-DP group is ordered (stage j, piece r) -> (j % l) * k + r over the l training stages of the
  // rank's generation stage: stage j's k ranks hold the k pieces of a generation shard that a split weight's
  // training shards make up (device_mesh.h). The generation model holds only those stages' weights.
  const int k = layout_.train().tp() / layout_.gen_tp();
  const int l = layout_.train().pp() / layout_.gen_pp();
  const int me = gather_comm_->rank();
  const int my_stage = me / k, my_piece = me % k;  // my_stage: among the l
  const torch::TensorOptions options = train_->parameters().front().options().requires_grad(false);
  auto broadcast = [&](torch::Tensor& piece, int root) { broadcast_counted(piece, root, stats); };
  for (auto& w : weights_) {
    const bool mine = w.stage % l == my_stage;
    int64_t gen_numel = 1;
    for (int64_t d : w.gen_shape) gen_numel *= d;
    // With stages every weight is split (over them, if not over tensor-parallel ranks): M counts them all.
    stats.model_bytes += gen_numel * static_cast<int64_t>(options.dtype().itemsize()) *
                         (w.gen_dim == ShardDim::kReplicated ? 1 : layout_.gen_tp());
    torch::Tensor gen;
    // Every generation tensor rank holds its own block of the experts: M counts them all.
    if (w.split_expert) stats.model_bytes += gen_numel * static_cast<int64_t>(options.dtype().itemsize()) *
                                             (layout_.gen_tp() - 1);
    if (w.expert_piece >= 0) {
      // A folded expert: whole on one piece of its stage, which sends it to the group and keeps it in place.
      const bool owner = mine && w.train.defined();
      gen = owner && w.train.is_contiguous() ? w.train : torch::empty(w.gen_shape, options);
      if (owner && !gen.is_same(w.train)) gen.copy_(w.train);
      if (!owner || !gen.is_same(w.train)) w.gathered = gen;
      broadcast(gen, (w.stage % l) * k + w.expert_piece);
      // Every generation tensor rank holds its own block of the experts: M counts them all.
      stats.model_bytes += gen.nbytes() * (layout_.gen_tp() - 1);
    } else if (w.train_dim != ShardDim::kReplicated) {
      // Piece r is stage j's tensor-parallel rank r's training shard, sent by it to the group.
      const bool columns = w.train_dim == ShardDim::kColumns && k > 1;
      torch::Tensor gathered =
          columns ? torch::empty({k, w.gen_shape[0], w.gen_shape[1] / k}, options) : torch::empty(w.gen_shape, options);
      auto piece = [&](int r) {
        return columns ? gathered.select(0, r) : gathered.narrow(0, r * (w.gen_shape[0] / k), w.gen_shape[0] / k);
      };
      if (mine) piece(my_piece).copy_(w.train);
      for (int r = 0; r < k; ++r) {
        torch::Tensor p = piece(r);
        broadcast(p, (w.stage % l) * k + r);
      }
      if (mine) point_at(w.train, piece(my_piece));  // the old training storage is freed here
      w.gathered = gathered;
      gen = gathered;
    } else {
      // Whole on every rank of the owning stage: each of its k ranks sends a 1/k chunk of the generation
      // shard. The owning stage receives into its own weight (the same values) and allocates nothing; a split
      // expert gets a copy of its own there, so that the stage's gathered set can go.
      torch::Tensor local;
      if (mine)
        local = w.split_expert ? stage_experts_.at(w.name)
                               : shard_of(w.train, w.gen_dim, gen_tp_rank_, layout_.gen_tp());  // w.train when replicated
      gen = mine && local.is_contiguous() && !w.split_expert ? local : torch::empty(w.gen_shape, options);
      if (mine && !gen.is_same(local)) gen.copy_(local);
      if (!mine || !gen.is_same(local)) w.gathered = gen;
      torch::Tensor flat = gen.view({-1});
      for (int r = 0; r < k; ++r) {
        const int64_t begin = gen_numel * r / k, end = gen_numel * (r + 1) / k;
        torch::Tensor part = flat.narrow(0, begin, end - begin);
        broadcast(part, (w.stage % l) * k + r);
      }
    }
    point_at(w.gen, gen);
    stats.peak_extra_weight_bytes += gen.nbytes();
    // The tied copy is this rank's vocabulary rows of the embedding (piece my_piece of the generation shard).
    const bool tied = w.name == "model.embed_tokens.weight" && tied_copy_.defined();
    if (tied) point_at(tied_copy_, gen.narrow(0, my_piece * (gen.size(0) / k), gen.size(0) / k));
    // Measured, not assumed: does a training parameter still own memory of its own?
    if (mine && w.train.defined() && !w.train.storage().is_alias_of(w.gen.storage()))
      stats.redundant_bytes += w.train.nbytes();
    if (tied && !tied_copy_.storage().is_alias_of(w.gen.storage())) stats.redundant_bytes += tied_copy_.nbytes();
  }
  // A generation stage sees its own weights only; M is the whole model's.
  if (layout_.gen_pp() > 1)
    stats.model_bytes = train_->config().num_parameters() * static_cast<int64_t>(options.dtype().itemsize());
}

void HybridEngine::broadcast_counted(torch::Tensor& piece, int root, ReshardStats& stats) {
  gather_comm_->broadcast(piece, root);
  if (root == gather_comm_->rank())
    stats.bytes_sent += piece.nbytes() * (gather_comm_->size() - 1);
  else
    stats.bytes_received += piece.nbytes();
}

void HybridEngine::gather_stages_whole(ReshardStats& stats) {
  torch::NoGradGuard no_grad;
  const DeviceMesh& mesh = layout_.train();
  const int t = mesh.tp(), t_g = layout_.gen_tp();
  const MeshCoords me = mesh.coords(world_rank_);
  // hybridflow-v gathers inside the replica's model-parallel group (member j * t + i); allgather over the
  // world, where each of the d replicas sends 1/d of every piece (DeepSpeed-Chat).
  const bool world = mode_ == ReshardMode::kAllGather;
  const int d = world ? mesh.dp() : 1;
  auto member = [&](int stage, int replica, int tp_rank) {
    return world ? mesh.rank_of(MeshCoords{stage, replica, tp_rank}) : stage * t + tp_rank;
  };
  // Sends `piece` (which the owners have filled) as d chunks, chunk e from replica e of (stage, tp_rank).
  auto send_in_chunks = [&](const torch::Tensor& piece, int stage, int tp_rank) {
    torch::Tensor flat = piece.view({-1});
    const int64_t n = flat.numel();
    for (int e = 0; e < d; ++e) {
      torch::Tensor chunk = flat.narrow(0, n * e / d, n * (e + 1) / d - n * e / d);
      broadcast_counted(chunk, member(stage, e, tp_rank), stats);
    }
  };
  const torch::TensorOptions options = train_->parameters().front().options().requires_grad(false);
  for (auto& w : weights_) {
    const bool mine = w.stage == me.pp;
    std::vector<int64_t> shape = w.gen_shape;  // the whole tensor's
    if (w.gen_dim == ShardDim::kRows) shape[0] *= t_g;
    if (w.gen_dim == ShardDim::kColumns) shape[1] *= t_g;
    torch::Tensor full;
    if (w.train_dim != ShardDim::kReplicated) {
      // Tensor rank i's shard is piece i: rows stack; columns gather as [t, out, in / t], then interleave.
      const bool columns = w.train_dim == ShardDim::kColumns;
      torch::Tensor pieces =
          columns ? torch::empty({t, shape[0], shape[1] / t}, options) : torch::empty(shape, options);
      for (int i = 0; i < t; ++i) {
        torch::Tensor piece = columns ? pieces.select(0, i) : pieces.narrow(0, i * (shape[0] / t), shape[0] / t);
        if (mine && i == me.tp) piece.copy_(w.train);
        send_in_chunks(piece, w.stage, i);
      }
      full = columns ? pieces.movedim(0, 1).reshape(shape) : pieces;
    } else {
      // Whole on every rank of its stage: its t tensor ranks send a 1/t part each (in d chunks).
      full = mine ? w.train.detach().clone() : torch::empty(shape, options);
      torch::Tensor flat = full.view({-1});
      const int64_t n = flat.numel();
      for (int i = 0; i < t; ++i) send_in_chunks(flat.narrow(0, n * i / t, n * (i + 1) / t - n * i / t), w.stage, i);
    }
    stats.model_bytes += full.nbytes();
    stats.peak_extra_weight_bytes += full.nbytes();
    w.gathered = full;
    point_at(w.gen, w.gen_dim == ShardDim::kReplicated ? full : shard_of(full, w.gen_dim, gen_tp_rank_, t_g));
    // The baselines keep every training weight apart from the gathered model.
    if (mine) stats.redundant_bytes += w.train.nbytes();
    if (w.name == "model.embed_tokens.weight" && tied_copy_.defined()) stats.redundant_bytes += tied_copy_.nbytes();
  }
}

}  // namespace hybridflow
