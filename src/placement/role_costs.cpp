#include "hybridflow/placement/role_costs.h"

#include <algorithm>
#include <cmath>

#include "hybridflow/model/model_size.h"
#include "hybridflow/parallel/resharding.h"
#include "hybridflow/parallel/sequence_parallel_heads.h"
#include "hybridflow/parallel/weight_sync_volume.h"

namespace hybridflow::placement {

namespace {

double ceil_div(double a, double b) { return std::ceil(a / b); }

// Devices beyond the machine's compute units share them (this machine: processes beyond its cores).
double compute_share(const ClusterSpec& c) {
  return c.compute_units > 0 ? std::min(1.0, static_cast<double>(c.compute_units) / c.devices()) : 1.0;
}

double link_bandwidth(const ClusterSpec& c, bool crosses_nodes) {
  return (crosses_nodes ? c.inter_node_bandwidth : c.intra_node_bandwidth) * c.comm_efficiency;
}

double link_latency(const ClusterSpec& c, bool crosses_nodes) {
  return crosses_nodes ? c.inter_node_latency_s : c.intra_node_latency_s;
}

// Megatron's rank order puts a tensor-parallel group on consecutive devices and a stage on t * d of them.
bool tp_crosses(const ClusterSpec& c, const Layout& l) { return l.tp > c.gpus_per_node; }
bool dp_crosses(const ClusterSpec& c, const Layout& l) { return l.tp * l.dp > c.gpus_per_node; }
bool pp_crosses(const ClusterSpec& c, const Layout& l) { return l.devices() > c.gpus_per_node; }

double send_seconds(const ClusterSpec& c, double bytes, bool crosses_nodes) {
  return link_latency(c, crosses_nodes) + bytes / link_bandwidth(c, crosses_nodes);
}

// Activation bytes of `rows` sequences of `seq` tokens leaving a layer (the tensor-parallel all-reduce and
// pipeline message of one micro-batch).
double activation_bytes(const CostInputs& in, double rows, double seq) {
  return rows * seq * in.model.hidden * in.workload.param_bytes;
}

// Ulysses sequence parallelism (parallel/sequence_parallel.h) in one pass over a micro-batch of `rows`
// sequences of `seq` tokens: per layer, q, k and v trade the sequence split for a head split and the attention
// output trades back (four all-to-alls, each rank keeping 1 / sp of its slice; a group's ranks share one
// tensor-parallel rank and its heads), and the final hidden states are gathered once. A backward pass moves the
// same again.
double sequence_parallel_seconds(const CostInputs& in, const Layout& l, double rows, double seq, double layers) {
  if (l.sp <= 1) return 0;
  const ModelShape& m = in.model;
  const bool crosses = l.tp * l.sp > in.cluster.gpus_per_node;
  const double slice_tokens = rows * seq / l.sp;
  // A tensor-parallel rank trades its own heads (its KV heads, or the one it keeps where they are replicated).
  const RankHeads heads = tensor_parallel_rank_heads(m.heads, m.kv_heads, l.tp);
  const double qkvo = slice_tokens * (2.0 * static_cast<double>(heads.query) + 2.0 * static_cast<double>(heads.kv)) *
                      m.head_dim * in.workload.param_bytes;
  const double swaps = alltoall_seconds(in.cluster, qkvo, l.sp, crosses);
  return layers * swaps + allgather_seconds(in.cluster, activation_bytes(in, rows, seq), l.sp, crosses);
}

}  // namespace

Breakdown& Breakdown::operator+=(const Breakdown& o) {
  compute_s += o.compute_s;
  memory_s += o.memory_s;
  comm_s += o.comm_s;
  overhead_s += o.overhead_s;
  return *this;
}

Breakdown operator*(double k, const Breakdown& b) {
  return {k * b.compute_s, k * b.memory_s, k * b.comm_s, k * b.overhead_s};
}

double allreduce_seconds(const ClusterSpec& c, double bytes, int ranks, bool crosses_nodes) {
  if (ranks <= 1) return 0;
  const double steps = 2.0 * (ranks - 1);
  return steps * link_latency(c, crosses_nodes) + steps / ranks * bytes / link_bandwidth(c, crosses_nodes);
}

double allgather_seconds(const ClusterSpec& c, double bytes_received, int ranks, bool crosses_nodes) {
  if (ranks <= 1) return 0;
  return (ranks - 1) * link_latency(c, crosses_nodes) + bytes_received / link_bandwidth(c, crosses_nodes);
}

double alltoall_seconds(const ClusterSpec& c, double bytes_per_rank, int ranks, bool crosses_nodes) {
  if (ranks <= 1) return 0;
  return (ranks - 1) * link_latency(c, crosses_nodes) +
         bytes_per_rank * (ranks - 1) / ranks / link_bandwidth(c, crosses_nodes);
}

double model_weight_bytes(const CostInputs& in) { return in.model.parameters(false) * in.workload.param_bytes; }

Breakdown forward_seconds(const CostInputs& in, Role role, const Layout& l, int64_t rows) {
  const ClusterSpec& c = in.cluster;
  const Workload& w = in.workload;
  const double seq = static_cast<double>(w.sequence_length());
  const double per_replica = ceil_div(static_cast<double>(rows), l.replicas());
  const double micro = ceil_div(per_replica, static_cast<double>(w.infer_micro_rows));
  const double micro_rows = per_replica / micro;
  const double slots = micro + l.pp - 1;  // micro-batch slots on the pipeline's critical path
  const double stage_layers = static_cast<double>(in.model.layers) / l.pp;
  Breakdown b;
  const double flops = in.model.forward_flops(rows * seq, seq, has_value_head(role));
  b.compute_s = flops / l.devices() / (c.peak_flops * compute_share(c) * c.forward_efficiency) * slots / micro;
  const double act = activation_bytes(in, micro_rows, seq);
  b.comm_s = slots * stage_layers * 2 * allreduce_seconds(c, act, l.tp, tp_crosses(c, l));
  b.comm_s += slots * sequence_parallel_seconds(in, l, micro_rows, seq, stage_layers);
  if (l.pp > 1) b.comm_s += slots * send_seconds(c, act, pp_crosses(c, l));
  b.overhead_s = c.overheads.call_s + (c.overheads.layer_pass_s * stage_layers + c.overheads.micro_batch_s) * slots;
  return b;
}

Breakdown training_seconds(const CostInputs& in, Role role, const Layout& l, int64_t rows) {
  const ClusterSpec& c = in.cluster;
  const Workload& w = in.workload;
  const double seq = static_cast<double>(w.sequence_length());
  const double steps = static_cast<double>(w.ppo_epochs * w.mini_batches);  // optimizer steps
  const double per_replica = ceil_div(static_cast<double>(rows) / w.mini_batches, l.replicas());
  const double micro = ceil_div(per_replica, static_cast<double>(w.train_micro_rows));
  const double micro_rows = per_replica / micro;
  const double slots = micro + l.pp - 1;
  const double stage_layers = static_cast<double>(in.model.layers) / l.pp;
  const bool value_head = has_value_head(role);
  Breakdown b;
  const double flops = 3.0 * in.model.forward_flops(rows * seq, seq, value_head) * w.ppo_epochs;
  b.compute_s = flops / l.devices() / (c.peak_flops * compute_share(c) * c.train_efficiency) * slots / micro;
  const double act = activation_bytes(in, micro_rows, seq);
  // Two all-reduces per layer forward and two backward; activations forward and gradients back per stage.
  b.comm_s = steps * slots * stage_layers * 4 * allreduce_seconds(c, act, l.tp, tp_crosses(c, l));
  if (l.pp > 1) b.comm_s += steps * slots * 2 * send_seconds(c, act, pp_crosses(c, l));
  b.comm_s += steps * slots * 2 * sequence_parallel_seconds(in, l, micro_rows, seq, stage_layers);
  // Gradients reduced in fp32 over the data-parallel replicas each optimizer step (ZeRO-1's reduce-scatter
  // plus parameter all-gather moves the same volume).
  const double shard = in.model.parameters(value_head) / (l.tp * l.pp);
  b.comm_s += steps * allreduce_seconds(c, shard * 4.0, l.dp, dp_crosses(c, l));
  // AdamW reads and writes master weights and both moments, reads the gradient, writes the weight.
  const double optimizer_shard = w.distributed_optimizer ? shard / l.dp : shard;
  b.memory_s = steps * optimizer_shard * 32.0 / (c.memory_bandwidth * compute_share(c) * c.decode_efficiency);
  // A backward pass counts as two forward ones, in layers and in per-micro-batch work.
  b.overhead_s = c.overheads.call_s + (c.overheads.layer_pass_s * stage_layers + c.overheads.micro_batch_s) * 3 * slots * steps;
  return b;
}

GenerationCost generation_seconds(const CostInputs& in, const Layout& g, int64_t rows, double kv_capacity_bytes) {
  const ClusterSpec& c = in.cluster;
  const Workload& w = in.workload;
  const ModelShape& m = in.model;
  GenerationCost out;
  const double prompt = static_cast<double>(w.prompt_length), response = static_cast<double>(w.response_length);
  const double per_replica = ceil_div(static_cast<double>(rows), g.dp);
  // KV heads split over the tensor-parallel ranks, or replicated when there are fewer heads than ranks.
  const double kv_heads_per_rank = std::max<double>(1.0, ceil_div(static_cast<double>(m.kv_heads), g.tp));
  const double kv_token_all_layers = 2.0 * m.layers * kv_heads_per_rank * m.head_dim * w.param_bytes;
  const double kv_sequence_per_rank = kv_token_all_layers / g.pp * (prompt + response);
  double concurrent = std::floor(kv_capacity_bytes / kv_sequence_per_rank);
  if (!(concurrent >= 1)) {
    out.time.compute_s = kInfeasible;
    return out;
  }
  out.feasible = true;
  // rollout.max_num_seqs caps the rows a replica decodes at once (continuous batching refills the freed slots;
  // modelled as waves of that many rows, every response at the full length).
  if (w.max_num_seqs > 0) concurrent = std::min(concurrent, static_cast<double>(w.max_num_seqs));
  out.waves = static_cast<int64_t>(ceil_div(per_replica, concurrent));
  out.batch = static_cast<int64_t>(ceil_div(per_replica, static_cast<double>(out.waves)));
  const double b = static_cast<double>(out.batch);
  const double flops_rate = c.peak_flops * compute_share(c) * c.forward_efficiency;
  const double bytes_rate = c.memory_bandwidth * compute_share(c) * c.decode_efficiency;
  const bool tp_x = tp_crosses(c, g), pp_x = pp_crosses(c, g);
  // One micro-batch in flight: the stages of a replica run one after another (engine/generation.cpp), so
  // a replica's time is its whole model's work over t_g ranks.
  Breakdown wave;
  wave.compute_s += m.forward_flops(b * prompt, prompt, false) / g.tp / flops_rate;
  wave.comm_s += 2.0 * m.layers * allreduce_seconds(c, activation_bytes(in, b, prompt), g.tp, tp_x);
  if (g.pp > 1) wave.comm_s += (g.pp - 1) * send_seconds(c, activation_bytes(in, b, prompt), pp_x);
  wave.overhead_s += m.layers * c.overheads.layer_pass_s + c.overheads.micro_batch_s;
  const double context = prompt + (response + 1.0) / 2.0;  // the mean over the steps; KV reads are linear in it
  const double step_compute = b * m.decode_flops(context) / g.tp / flops_rate;
  const double step_bytes = m.matmul_parameters(false) * w.param_bytes / g.tp + b * context * kv_token_all_layers;
  const double step_memory = step_bytes / bytes_rate;
  (step_compute > step_memory ? wave.compute_s : wave.memory_s) += response * std::max(step_compute, step_memory);
  wave.comm_s += response * 2.0 * m.layers * allreduce_seconds(c, activation_bytes(in, b, 1), g.tp, tp_x);
  if (g.pp > 1) wave.comm_s += response * (g.pp - 1) * send_seconds(c, activation_bytes(in, b, 1), pp_x);
  wave.overhead_s += response * (m.layers * c.overheads.layer_pass_s + c.overheads.decode_step_s);
  out.time = static_cast<double>(out.waves) * wave;
  out.time.overhead_s += c.overheads.call_s;
  return out;
}

Breakdown reshard_seconds(const CostInputs& in, const Layout& actor, const Layout& rollout) {
  Breakdown b;
  if (actor.tp == rollout.tp && actor.pp == rollout.pp) return b;  // generates in the training layout
  const ClusterSpec& c = in.cluster;
  const double weights = model_weight_bytes(in);
  const GenerationLayout layout(DeviceMesh(actor.pp, actor.dp, actor.tp), rollout.tp, rollout.pp);
  const ReshardCost cost = paper_reshard_cost(ReshardMode::kHybridFlow, layout, static_cast<int64_t>(weights));
  const int stages_per_group = actor.pp / rollout.pp;
  const bool crosses = actor.tp > c.gpus_per_node || (stages_per_group > 1 && actor.devices() > c.gpus_per_node);
  b.comm_s = allgather_seconds(c, static_cast<double>(cost.bytes_received), layout.micro_dp(), crosses);
  // Back to training: each rank copies its training shard out of the generation weights.
  b.memory_s = 2.0 * weights / (actor.tp * actor.pp) / (c.memory_bandwidth * compute_share(c));
  b.overhead_s = 2.0 * in.model.layers * c.overheads.layer_pass_s;
  return b;
}

Breakdown weight_sync_seconds(const CostInputs& in, const Layout& actor, const Layout& rollout, bool same_node) {
  const ClusterSpec& c = in.cluster;
  const WeightSyncVolume v = standalone_weight_sync_volume(DeviceMesh(actor.pp, actor.dp, actor.tp), rollout.tp,
                                                           rollout.pp, rollout.dp,
                                                           static_cast<int64_t>(model_weight_bytes(in)));
  Breakdown b;
  const double busiest = static_cast<double>(std::max(v.bytes_sent_per_actor_rank, v.bytes_received_per_rollout_rank));
  b.comm_s = send_seconds(c, busiest, !same_node);
  b.overhead_s = c.overheads.call_s + in.model.layers * c.overheads.layer_pass_s;
  return b;
}

RoleMemory role_memory(const CostInputs& in, Role role, const Layout& l, bool with_actor, const Layout& actor) {
  const ModelShape& m = in.model;
  const Workload& w = in.workload;
  const double pb = w.param_bytes;
  const double seq = static_cast<double>(w.sequence_length());
  RoleMemory out;
  if (role == Role::kRollout) {
    // A standalone pool holds every routed expert whole on each of its tensor ranks (the actor sends them
    // gathered); colocated, the 3D-HybridEngine folds them over the generation tensor ranks like the rest.
    const double whole_experts = with_actor ? 0.0 : model_size(m.model_config()).experts;
    const double weights = ((m.parameters(false) - whole_experts) / (l.tp * l.pp) + whole_experts / l.pp) * pb;
    const double kv_heads_per_rank = std::max<double>(1.0, ceil_div(static_cast<double>(m.kv_heads), l.tp));
    out.kv_minimum = 2.0 * m.layers / l.pp * kv_heads_per_rank * m.head_dim * pb * seq;
    if (with_actor) {
      // The 3D-HybridEngine gathers the generation shard around the training shard it already holds.
      const double training_shard = m.parameters(false) * pb / (actor.tp * actor.pp);
      out.transient = std::max(0.0, weights - training_shard) + out.kv_minimum;
    } else {
      out.persistent = weights;
      out.transient = out.kv_minimum;
    }
    return out;
  }
  const bool value_head = has_value_head(role);
  const double shard = m.parameters(value_head) / (l.tp * l.pp);
  out.persistent = shard * pb;
  // A forward pass holds one layer's working set of a micro-batch, and a log-prob pass the vocabulary's logits.
  // Sequence parallelism splits the layers' tokens over its group; the head runs on the gathered hidden states,
  // so the logits stay whole on every rank.
  const double infer_rows = static_cast<double>(w.infer_micro_rows);
  double forward = infer_rows * seq / l.sp * (4.0 * m.hidden + 2.0 * m.intermediate / l.tp) * pb;
  if (!value_head) forward += infer_rows * seq * static_cast<double>(m.vocab) / l.tp * 4.0;
  out.transient = forward;
  if (trains(role)) {
    // The model layer's formula (model/model_size.h) with Megatron's distributed optimizer: gradients in the
    // weights' dtype; fp32 Adam moments and (under bf16) fp32 masters, partitioned over the data-parallel
    // ranks by ZeRO-1; activations by Megatron's estimate, plus the vocabulary's logits and their gradient.
    TrainingMemoryOptions o;
    o.weight_bytes = pb;
    o.tp = l.tp;
    o.pp = l.pp;
    o.zero = w.distributed_optimizer ? l.dp : 1;
    o.micro_rows = w.train_micro_rows;
    o.sequence = w.sequence_length();
    o.value_head = value_head;
    o.fp32_gradients = false;
    o.masters_partitioned = true;
    const TrainingMemory t = training_memory(m.model_config(), o);
    out.persistent += t.grads + t.optimizer;
    o.sequence = (w.sequence_length() + l.sp - 1) / l.sp;  // a rank's slice of each sequence through the layers
    const double layer_activations = l.sp > 1 ? training_memory(m.model_config(), o).activations : t.activations;
    out.transient = std::max(out.transient, layer_activations + t.logits);
  }
  return out;
}

}  // namespace hybridflow::placement
