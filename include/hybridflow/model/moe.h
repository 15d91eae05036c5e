// Mixture-of-experts routing as transformers computes it for Qwen2-MoE, Qwen3-MoE and Mixtral: the router's
// logits over all experts, a float32 softmax over them, each token's top k, renormalised to sum 1 when
// norm_topk_prob (Mixtral always). Also the load-balancing loss of transformers' load_balancing_loss_func
// and router replay (verl's router_replay): a forward can record every token's experts, a later one route
// every token to given experts, so that training sees the routing the rollout sampled with.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace hybridflow {

// One layer's routing of `tokens` rows (a [batch, seq] input flattened batch-major).
struct TopKRouting {
  torch::Tensor weights;  // [tokens, k] float32: the probability each chosen expert's output is scaled by
  torch::Tensor experts;  // [tokens, k] int64, in descending probability (as torch.topk orders them)
};

// Top k of softmax(router_logits [tokens, experts]) in float32, renormalised when `normalise`.
TopKRouting route_top_k(const torch::Tensor& router_logits, int64_t k, bool normalise);
// Router replay: the given experts [tokens, k] with the weights the current logits give them (the float32
// softmax gathered at those experts, renormalised when `normalise`), so the router still gets its gradient.
// A token whose experts are -1 (no recorded routing: padding, or a generated sequence's last token, which
// was never fed back) is routed by the router's own top k.
TopKRouting route_replayed(const torch::Tensor& router_logits, const torch::Tensor& experts, bool normalise);

// transformers' load_balancing_loss_func (Switch Transformer's auxiliary loss), not yet times
// router_aux_loss_coef: num_experts x sum over experts of (the fraction of top-k assignments it gets) x (its
// mean router probability), both over every layer's tokens together. router_logits: one [tokens, experts]
// tensor per MoE layer; attention_mask [batch, seq] (tokens = batch x seq) excludes padding, or undefined.
torch::Tensor load_balancing_loss(const std::vector<torch::Tensor>& router_logits, int64_t num_experts, int64_t top_k,
                                  const torch::Tensor& attention_mask = {});

// verl's actor_rollout_ref.actor.router_replay.mode: off, record (each forward keeps its routing), replay
// (each forward routes by a given routing).
enum class RouterReplayMode { kOff, kRecord, kReplay };

// Every token's experts in every MoE layer of one forward (of one pipeline stage's layers), in layer order:
// [batch, seq, k] int64 each.
struct ExpertRouting {
  std::vector<torch::Tensor> layers;
  bool empty() const { return layers.empty(); }
};

// [batch, seq] bool: true where a token's set of experts differs between `a` and `b` in any layer (the
// order of the k experts does not matter). The two must have the same layers and shapes.
torch::Tensor routing_differs(const ExpertRouting& a, const ExpertRouting& b);

// What gathering a model's experts from its expert-parallel group did on one rank (CausalLM::gather_experts),
// measured: the 3D-HybridEngine reports it as the expert part of a switch (engine/expert_reshard.h).
// Whether a parameter name is one of a mixture-of-experts layer's routed experts ("...experts.<e>....").
bool is_expert_parameter_name(const std::string& name);

struct ExpertGather {
  int64_t expert_bytes = 0;    // the gathered set: every expert of every MoE layer, now held by this rank
  int64_t bytes_sent = 0;      // this rank's own experts, to each other rank of the group
  int64_t bytes_received = 0;  // the other ranks' experts
  int64_t redundant_bytes = 0; // this rank's own experts still held apart from the gathered set
};

}  // namespace hybridflow
