// Top-k routing, the load-balancing loss and the sparse MLP block, computed as transformers 5 computes them
// (Qwen2MoeTopKRouter / Qwen3MoeTopKRouter / MixtralTopKRouter, their Experts modules and
// load_balancing_loss_func), so that logits agree with it to rounding.
#include "hybridflow/model/moe.h"

#include <ATen/ops/_grouped_mm.h>

#include <string>

#include "hybridflow/core/error.h"
#include "hybridflow/model/cuda_fused.h"
#include "model/moe_block.h"

namespace hybridflow {

bool is_expert_parameter_name(const std::string& name) { return name.find(".experts.") != std::string::npos; }

TopKRouting route_top_k(const torch::Tensor& router_logits, int64_t k, bool normalise) {
  HF_CHECK(router_logits.dim() == 2 && k >= 1 && k <= router_logits.size(1), "route_top_k: router logits must be ",
           "[tokens, experts] with k in [1, experts], got ", router_logits.sizes(), " and k = ", k);
  auto probs = torch::softmax(router_logits.to(torch::kFloat32), -1);
  auto [weights, experts] = probs.topk(k, -1);
  if (normalise) weights = weights / weights.sum(-1, /*keepdim=*/true);
  return {weights, experts};
}

TopKRouting route_replayed(const torch::Tensor& router_logits, const torch::Tensor& experts, bool normalise) {
  HF_CHECK(router_logits.dim() == 2 && experts.dim() == 2 && experts.size(0) == router_logits.size(0),
           "router replay: the replayed experts must be [tokens, k] for router logits of ", router_logits.sizes(),
           ", got ", experts.sizes());
  auto ids = experts.to(router_logits.device(), torch::kInt64);
  HF_CHECK(ids.numel() == 0 || (ids.min().item<int64_t>() >= -1 && ids.max().item<int64_t>() < router_logits.size(1)),
           "router replay: the replayed experts must be in [0, ", router_logits.size(1), ") (or -1: not recorded)");
  const auto probs = torch::softmax(router_logits.to(torch::kFloat32), -1);
  if (ids.numel() > 0 && ids.min().item<int64_t>() < 0) {
    // A token without a recorded routing (padding, a sequence's last token) keeps the router's own top k.
    const auto unrecorded = ids.lt(0).any(-1, /*keepdim=*/true);
    ids = torch::where(unrecorded, std::get<1>(probs.topk(ids.size(1), -1)), ids);
  }
  auto weights = probs.gather(1, ids);
  if (normalise) weights = weights / weights.sum(-1, /*keepdim=*/true);
  return {weights, ids};
}

torch::Tensor load_balancing_loss(const std::vector<torch::Tensor>& router_logits, int64_t num_experts, int64_t top_k,
                                  const torch::Tensor& attention_mask) {
  HF_CHECK(!router_logits.empty(), "load_balancing_loss: no router logits (the model has no MoE layer here)");
  const auto device = router_logits.front().device();
  const auto fp32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  torch::Tensor assigned = torch::zeros({num_experts}, fp32), probability = torch::zeros({num_experts}, fp32);
  torch::Tensor rows = torch::zeros({}, fp32);
  torch::Tensor mask;
  if (attention_mask.defined()) {
    mask = attention_mask.reshape({-1}).to(device, torch::kFloat32);
    HF_CHECK(mask.size(0) == router_logits.front().size(0), "load_balancing_loss: the attention mask has ",
             mask.size(0), " tokens, the router logits ", router_logits.front().size(0));
  }
  for (const auto& logits : router_logits) {
    // In the logits' dtype, as transformers' softmax without a dtype argument.
    auto probs = torch::softmax(logits, -1);
    auto chosen = std::get<1>(probs.topk(top_k, -1)).reshape({-1});
    if (mask.defined()) {
      assigned = assigned + torch::zeros({num_experts}, fp32).scatter_add(0, chosen, mask.repeat_interleave(top_k));
      probability = probability + (probs.to(torch::kFloat32) * mask.unsqueeze(-1)).sum(0);
      rows = rows + mask.sum();
    } else {
      assigned = assigned + torch::bincount(chosen, {}, num_experts).to(torch::kFloat32);
      probability = probability + probs.to(torch::kFloat32).sum(0);
      rows = rows + static_cast<double>(probs.size(0));
    }
  }
  return (assigned / rows * (probability / rows)).sum() * static_cast<double>(num_experts);
}

torch::Tensor routing_differs(const ExpertRouting& a, const ExpertRouting& b) {
  HF_CHECK(!a.empty() && a.layers.size() == b.layers.size(), "routing_differs: the routings cover ", a.layers.size(),
           " and ", b.layers.size(), " MoE layers");
  torch::Tensor out;
  for (size_t i = 0; i < a.layers.size(); ++i) {
    HF_CHECK(a.layers[i].sizes() == b.layers[i].sizes(), "routing_differs: layer ", i, " has shapes ",
             a.layers[i].sizes(), " and ", b.layers[i].sizes());
    auto sorted_a = std::get<0>(a.layers[i].sort(-1));
    auto sorted_b = std::get<0>(b.layers[i].to(a.layers[i].device()).sort(-1));
    auto layer = sorted_a.ne(sorted_b).any(-1);
    out = out.defined() ? out.logical_or(layer) : layer;
  }
  return out;
}

namespace moe {

ExpertImpl::ExpertImpl(int64_t hidden, int64_t width, const char* gate_name, const char* up_name,
                       const char* down_name) {
  auto projection = [](int64_t in, int64_t out) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
  };
  gate = register_module(gate_name, projection(hidden, width));
  up = register_module(up_name, projection(hidden, width));
  down = register_module(down_name, projection(width, hidden));
}

torch::Tensor ExpertImpl::forward(const torch::Tensor& x) { return down(torch::silu(gate(x)) * up(x)); }

SparseBlockImpl::SparseBlockImpl(const ModelConfig& c)
    : top_k_(c.moe.num_experts_per_tok),
      normalise_(c.moe.norm_topk_prob || c.model_type == "mixtral"),
      float_weights_(c.model_type == "mixtral"),
      hidden_(c.hidden_size),
      width_(c.expert_intermediate_size()),
      gate_name_(c.expert_gate_name()),
      up_name_(c.expert_up_name()),
      down_name_(c.expert_down_name()),
      local_count_(c.moe.num_experts) {
  gate = register_module("gate", torch::nn::Linear(torch::nn::LinearOptions(c.hidden_size, c.moe.num_experts).bias(false)));
  auto holder = holder_ = register_module("experts", std::make_shared<torch::nn::Module>());
  for (int64_t e = 0; e < c.moe.num_experts; ++e) {
    experts.push_back(Expert(c.hidden_size, c.expert_intermediate_size(), c.expert_gate_name(), c.expert_up_name(),
                             c.expert_down_name()));
    holder->register_module(std::to_string(e), experts.back());
  }
  if (c.shared_expert()) {
    shared_expert = register_module(
        "shared_expert", Expert(c.hidden_size, c.moe.shared_expert_intermediate_size, "gate_proj", "up_proj", "down_proj"));
    shared_expert_gate =
        register_module("shared_expert_gate", torch::nn::Linear(torch::nn::LinearOptions(c.hidden_size, 1).bias(false)));
  }
}

torch::Tensor SparseBlockImpl::forward(const torch::Tensor& x, const LayerIO& io) {
  const auto flat = x.reshape({-1, x.size(-1)});
  const auto logits = gate(flat);
  if (io.router_logits != nullptr) *io.router_logits = logits;
  TopKRouting routing;
  if (io.replay != nullptr) {
    HF_CHECK(io.replay->dim() == 2 && io.replay->size(0) == flat.size(0) && io.replay->size(1) == top_k_,
             "router replay: a MoE layer of ", flat.size(0), " tokens needs [", flat.size(0), ", ", top_k_,
             "] replayed experts, got ", io.replay->sizes());
    routing = route_replayed(logits, *io.replay, normalise_);
    if (io.differs != nullptr) {
      torch::NoGradGuard no_grad;
      auto own = std::get<0>(route_top_k(logits, top_k_, normalise_).experts.sort(-1));
      *io.differs = own.ne(std::get<0>(routing.experts.sort(-1))).any(-1);
    }
  } else {
    routing = route_top_k(logits, top_k_, normalise_);
  }
  if (io.experts != nullptr) *io.experts = routing.experts;
  torch::Tensor out;
  if (!ep_.enabled() || gathered_) {
    out = run_experts(flat, routing, experts, float_weights_);
  } else if (!same_tokens_.enabled()) {
    out = run_experts_parallel(flat, routing, experts, first_local_, local_count_, ep_, float_weights_);
  } else if (same_tokens_.size() == ep_.size()) {
    // Folded over exactly the tensor-parallel ranks, which hold the same tokens: each runs its own experts on the
    // tokens routed to them and the partial outputs are summed, as a row-parallel MLP's are (one all-reduce, no
    // exchange); the inputs' and the router weights' partial gradients sum over the ranks on the way back.
    TopKRouting shared{copy_to_tensor_parallel(routing.weights, same_tokens_), routing.experts};
    out = reduce_from_tensor_parallel(run_expert_range(copy_to_tensor_parallel(flat, same_tokens_), shared, experts,
                                                       first_local_, local_count_, float_weights_),
                                      same_tokens_);
  } else {
    // Folded over the tensor-parallel ranks of several replicas: each exchanges its share of its replica's rows
    // (padded to split evenly; a padding row weighs 0), so that every (token, slot) pair runs once in the group.
    const int64_t rows = flat.size(0), n = same_tokens_.size(), padded = (rows + n - 1) / n * n;
    auto pad = [&](const torch::Tensor& t) {
      return padded == rows ? t : torch::cat({t, torch::zeros({padded - rows, t.size(1)}, t.options())});
    };
    TopKRouting mine{scatter_rows_to_tensor_parallel(pad(routing.weights), same_tokens_),
                     pad(routing.experts).narrow(0, same_tokens_.rank() * (padded / n), padded / n)};
    const auto part = run_experts_parallel(scatter_rows_to_tensor_parallel(pad(flat), same_tokens_), mine, experts,
                                           first_local_, local_count_, ep_, float_weights_);
    out = gather_rows_from_tensor_parallel(part, same_tokens_).narrow(0, 0, rows);
  }
  if (shared_expert) out = out + torch::sigmoid(shared_expert_gate(flat)) * shared_expert(flat);
  return out.view(x.sizes());
}

namespace {

// Dispatch: the (token, slot) assignments sorted by expert, so each expert's tokens are one contiguous group
// (under expert parallelism also sorted by owner, rank e / local experts).
struct ExpertSortedAssignments {
  torch::Tensor tokens;            // the token of each assignment, in expert order
  torch::Tensor weights;           // its router weight
  std::vector<int64_t> per_expert; // assignments per expert
};

ExpertSortedAssignments sort_assignments_by_expert(const torch::Tensor& x, const TopKRouting& routing, int64_t count,
                                                   bool float_weights) {
  const int64_t k = routing.experts.size(1);
  const auto assigned = routing.experts.reshape({-1});
  const auto order = std::get<1>(assigned.sort(/*stable=*/true, 0, /*descending=*/false));
  ExpertSortedAssignments out;
  out.tokens = order.div(k, "floor");
  out.weights = routing.weights.reshape({-1}).index_select(0, order);
  // Qwen's routers hand their experts weights in the activations' dtype; Mixtral's stay float32.
  if (!float_weights) out.weights = out.weights.to(x.scalar_type());
  const auto sizes = torch::bincount(assigned, {}, count).to(torch::kCPU);
  out.per_expert.assign(sizes.data_ptr<int64_t>(), sizes.data_ptr<int64_t>() + count);
  return out;
}

bool expert_groups_take_grouped_gemm(const torch::Tensor& rows, std::vector<Expert>& experts, int64_t first) {
  const auto& w = experts[static_cast<size_t>(first)]->gate->weight;  // [width, hidden]
  return rows.size(0) > 0 && grouped_expert_gemm_applies(rows, w.scalar_type(), w.size(1), w.size(0));
}

}  // namespace

// Stacking copies the weights each call: the price of keeping them as transformers' per-expert tensors.
torch::Tensor expert_groups_grouped_gemm(const torch::Tensor& rows, std::vector<Expert>& experts, int64_t first,
                                         const std::vector<int64_t>& sizes) {
  std::vector<torch::Tensor> gates, ups, downs;
  std::vector<int32_t> ends;
  int64_t end = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto& expert = experts[static_cast<size_t>(first) + i];
    gates.push_back(expert->gate->weight);
    ups.push_back(expert->up->weight);
    downs.push_back(expert->down->weight);
    end += sizes[i];
    ends.push_back(static_cast<int32_t>(end));
  }
  const auto offsets = torch::tensor(ends, torch::kInt32).to(rows.device());
  auto project = [&](const torch::Tensor& in, const std::vector<torch::Tensor>& weights) {
    return at::_grouped_mm(in, torch::stack(weights).transpose(1, 2), offsets);
  };
  return project(torch::silu(project(rows, gates)) * project(rows, ups), downs);
}

torch::Tensor run_expert_range(const torch::Tensor& x, const TopKRouting& routing, std::vector<Expert>& experts,
                               int64_t first, int64_t count, bool float_weights) {
  const auto [tokens, weights, size] =
      sort_assignments_by_expert(x, routing, static_cast<int64_t>(experts.size()), float_weights);
  // The range's assignments are contiguous in expert order.
  int64_t begin = 0, n = 0;
  for (int64_t e = 0; e < first; ++e) begin += size[static_cast<size_t>(e)];
  for (int64_t e = first; e < first + count; ++e) n += size[static_cast<size_t>(e)];
  auto out = torch::zeros_like(x);
  // No token here: the inputs stay in the graph all the same (their backward may be collective).
  if (n == 0) return out + (x.sum() * 0 + weights.sum() * 0).to(x.scalar_type());
  const auto rows = tokens.narrow(0, begin, n);
  const auto scale = weights.narrow(0, begin, n).unsqueeze(1);
  const std::vector<int64_t> sizes(size.begin() + first, size.begin() + first + count);
  if (expert_groups_take_grouped_gemm(x, experts, first)) {
    const auto y = expert_groups_grouped_gemm(x.index_select(0, rows), experts, first, sizes) * scale;
    return out.index_add_(0, rows, y.to(x.scalar_type()));
  }
  // Combine: each group's outputs, weighted, added back into its tokens' rows.
  int64_t offset = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t m = sizes[static_cast<size_t>(i)];
    if (m == 0) continue;
    const auto group = rows.narrow(0, offset, m);
    auto y = experts[static_cast<size_t>(first + i)]->forward(x.index_select(0, group)) * scale.narrow(0, offset, m);
    out.index_add_(0, group, y.to(x.scalar_type()));
    offset += m;
  }
  return out;
}

torch::Tensor run_experts(const torch::Tensor& x, const TopKRouting& routing, std::vector<Expert>& experts,
                          bool float_weights) {
  return run_expert_range(x, routing, experts, 0, static_cast<int64_t>(experts.size()), float_weights);
}

void SparseBlockImpl::shard_experts(const ExpertParallelGroup& ep, const TensorParallelGroup& same_tokens) {
  const auto total = static_cast<int64_t>(experts.size());
  HF_CHECK(!ep_.enabled(), "expert parallelism: the experts are already sharded");
  HF_CHECK(total % ep.size() == 0, "expert_model_parallel_size ", ep.size(), " does not divide num_experts = ",
           total, "; choose a size that divides the expert count");
  if (!ep.enabled()) return;
  HF_CHECK(ep.size() % same_tokens.size() == 0, "expert parallelism: the ", same_tokens.size(),
           " tensor-parallel ranks folded into an expert-parallel group of ", ep.size(), " are not part of it");
  ep_ = ep;
  same_tokens_ = same_tokens;
  local_count_ = total / ep.size();
  first_local_ = ep.rank() * local_count_;
  for (int64_t e = 0; e < total; ++e) {
    if (e >= first_local_ && e < first_local_ + local_count_) continue;
    holder_->unregister_module(std::to_string(e));
    experts[static_cast<size_t>(e)] = Expert(nullptr);
  }
}

void SparseBlockImpl::gather_experts(ExpertGather& moved) {
  if (!ep_.enabled() || gathered_) return;
  torch::NoGradGuard no_grad;
  Communicator& comm = *ep_.comm();
  const int64_t before = comm.stats().of("all_gather").bytes;
  // Each projection of the local experts stacked, [local, out, in], gathered into [experts, out, in].
  auto gathered = [&](auto projection) {
    std::vector<torch::Tensor> local;
    for (int64_t e = first_local_; e < first_local_ + local_count_; ++e)
      local.push_back(projection(experts[static_cast<size_t>(e)])->weight);
    return comm.all_gather_cat(torch::stack(local), 0);
  };
  const auto gates = gathered([](Expert& x) { return x->gate; });
  const auto ups = gathered([](Expert& x) { return x->up; });
  const auto downs = gathered([](Expert& x) { return x->down; });
  const int64_t contributed = comm.stats().of("all_gather").bytes - before;
  moved.bytes_sent += contributed * (comm.size() - 1);
  moved.bytes_received += (gates.nbytes() + ups.nbytes() + downs.nbytes()) - contributed;
  moved.expert_bytes += gates.nbytes() + ups.nbytes() + downs.nbytes();
  const auto options = gates.options();
  for (int64_t e = 0; e < static_cast<int64_t>(experts.size()); ++e) {
    auto& slot = experts[static_cast<size_t>(e)];
    if (!slot) {
      // Another rank's expert: a module whose weights are slices of the gathered tensors.
      slot = Expert(hidden_, width_, gate_name_, up_name_, down_name_);
      slot->to(options.device(), options.dtype().toScalarType());
      for (auto& p : slot->parameters()) p.set_requires_grad(false);
    }
    slot->gate->weight.set_(gates[e]);  // this rank's own: the old storage is freed here
    slot->up->weight.set_(ups[e]);
    slot->down->weight.set_(downs[e]);
  }
  gathered_projections_ = {gates, ups, downs};
  // Measured, not assumed: does an own expert still hold memory apart from the gathered set?
  for (int64_t e = first_local_; e < first_local_ + local_count_; ++e)
    for (const auto& p : experts[static_cast<size_t>(e)]->parameters())
      if (!p.storage().is_alias_of(gates.storage()) && !p.storage().is_alias_of(ups.storage()) &&
          !p.storage().is_alias_of(downs.storage()))
        moved.redundant_bytes += p.nbytes();
  gathered_ = true;
}

void SparseBlockImpl::release_gathered_experts() {
  if (!gathered_) return;
  torch::NoGradGuard no_grad;
  for (int64_t e = 0; e < static_cast<int64_t>(experts.size()); ++e) {
    auto& slot = experts[static_cast<size_t>(e)];
    if (e < first_local_ || e >= first_local_ + local_count_) {
      slot = Expert(nullptr);
      continue;
    }
    for (auto& p : slot->parameters()) p.set_(p.detach().clone(at::MemoryFormat::Contiguous));
  }
  gathered_projections_.clear();
  gathered_ = false;
}

void SparseBlockImpl::add_gathered_expert_weights(const std::string& prefix,
                                                  std::map<std::string, torch::Tensor>& out) const {
  HF_CHECK(gathered_, "SparseBlock: the experts are not gathered");
  const char* names[] = {gate_name_, up_name_, down_name_};
  for (size_t p = 0; p < gathered_projections_.size(); ++p)
    for (int64_t e = 0; e < gathered_projections_[p].size(0); ++e)
      out.emplace(prefix + ".experts." + std::to_string(e) + "." + names[p] + ".weight", gathered_projections_[p][e]);
}

torch::Tensor run_experts_parallel(const torch::Tensor& x, const TopKRouting& routing, std::vector<Expert>& experts,
                                   int64_t first_local, int64_t local_count, const ExpertParallelGroup& ep,
                                   bool float_weights) {
  const int64_t ranks = ep.size(), count = local_count * ranks;
  const auto [tokens, weights, per_expert] = sort_assignments_by_expert(x, routing, count, float_weights);
  // What each rank sends each of this rank's experts: [ranks x local] counts, source-major.
  const std::vector<int64_t> incoming = exchange_counts(per_expert, ep);
  std::vector<int64_t> send_rows(static_cast<size_t>(ranks), 0), recv_rows(static_cast<size_t>(ranks), 0);
  for (int64_t i = 0; i < count; ++i) {
    send_rows[static_cast<size_t>(i / local_count)] += per_expert[static_cast<size_t>(i)];
    recv_rows[static_cast<size_t>(i / local_count)] += incoming[static_cast<size_t>(i)];
  }
  const auto received = exchange_rows(x.index_select(0, tokens), send_rows, recv_rows, ep);
  // The received rows regrouped by local expert (source rank, then the source's order, within each).
  const auto incoming_sizes = torch::tensor(incoming, torch::kLong);
  const auto local_ids =
      torch::arange(local_count, torch::kLong).repeat({ranks}).repeat_interleave(incoming_sizes).to(x.device());
  const auto by_expert = std::get<1>(local_ids.sort(/*stable=*/true, 0, /*descending=*/false));
  std::vector<int64_t> local_sizes(static_cast<size_t>(local_count), 0);
  for (int64_t l = 0; l < local_count; ++l)
    for (int64_t i = 0; i < ranks; ++i)
      local_sizes[static_cast<size_t>(l)] += incoming[static_cast<size_t>(i * local_count + l)];
  std::vector<torch::Tensor> outputs;
  if (expert_groups_take_grouped_gemm(received, experts, first_local)) {
    outputs.push_back(
        expert_groups_grouped_gemm(received.index_select(0, by_expert), experts, first_local, local_sizes));
  } else {
    int64_t offset = 0;
    for (int64_t l = 0; l < local_count; ++l) {
      const int64_t n = local_sizes[static_cast<size_t>(l)];
      if (n == 0) continue;
      const auto rows = by_expert.narrow(0, offset, n);
      outputs.push_back(experts[static_cast<size_t>(first_local + l)]->forward(received.index_select(0, rows)));
      offset += n;
    }
  }
  // A rank that received nothing still sends (nothing) back through the graph, so that every rank's backward
  // runs both exchanges.
  const auto computed = outputs.empty() ? received * 0 : torch::cat(outputs).index_select(0, by_expert.argsort());
  const auto returned = exchange_rows(computed, recv_rows, send_rows, ep);
  auto out = torch::zeros_like(x);
  out.index_add_(0, tokens, (returned * weights.unsqueeze(1)).to(x.scalar_type()));
  return out;
}

}  // namespace moe
}  // namespace hybridflow
