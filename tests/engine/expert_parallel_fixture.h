// Shared pieces of the multi-process expert-parallel tests: a tiny Qwen3-MoE (2 layers, every one sparse, 4
// experts of width 16 at hidden size 32, top 2; 4 experts split over 2 and 4 ranks), made with the same weights
// in every process.
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/tensor_parallel_fixture.h"
#include "hybridflow/parallel/collectives.h"

namespace hybridflow::testing {

inline ModelConfig expert_parallel_config() {
  ModelConfig c = tiny_model_config({.vocab_size = 64, .hidden_size = 32, .max_position_embeddings = 128});
  c.model_type = "qwen3_moe";
  c.architecture = causal_lm_architecture("qwen3_moe");
  c.moe.num_experts = 4;
  c.moe.num_experts_per_tok = 2;
  c.moe.moe_intermediate_size = 16;
  c.moe.norm_topk_prob = true;
  c.moe.router_aux_loss_coef = 0.0;
  return c;
}

// Routers large enough that tokens spread over the experts.
inline CausalLM expert_model() {
  torch::manual_seed(1234);
  CausalLM model(expert_parallel_config());
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters())
    if (item.key().ends_with("mlp.gate.weight")) item.value().normal_(0.0, 0.5);
  return model;
}

inline bool is_expert(const std::string& name) { return name.find(".experts.") != std::string::npos; }

// Rows [rank * n, (rank + 1) * n) of rl_batch()'s 4, n = 4 / ranks.
inline DataProto rows_of(int rank, int ranks) {
  const int64_t n = 4 / ranks;
  return rl_batch().slice(rank * n, (rank + 1) * n);
}

// PPO's surrogate summed over this batch's response tokens, over the whole batch's token count.
inline torch::Tensor globally_weighted_loss(CausalLM& model, const DataProto& m, double all_tokens) {
  auto out = response_log_probs(model, m.tensor("input_ids"), m.tensor("attention_mask"), kResponseLen);
  auto ratio = torch::exp(out.log_probs - m.tensor("old_log_probs"));
  const auto& adv = m.tensor("advantages");
  auto surrogate = -torch::min(ratio * adv, torch::clamp(ratio, 0.8, 1.2) * adv);
  return ((surrogate - 0.01 * out.entropy) * m.tensor("loss_mask")).sum() / all_tokens;
}

inline std::map<std::string, torch::Tensor> grads_by_name(CausalLMImpl& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model.named_parameters())
    out[item.key()] = item.value().grad().defined() ? item.value().grad().clone() : torch::zeros_like(item.value());
  return out;
}

// The entries of `all` this rank holds (its experts and every replicated tensor, of its pipeline stage).
inline std::map<std::string, torch::Tensor> held(const std::map<std::string, torch::Tensor>& all, CausalLMImpl& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model.named_parameters()) out[item.key()] = all.at(item.key());
  return out;
}

// With split experts (and tensor parallelism, or none), with `mine` this replica's rows of rl_batch(): the loss summed over
// the replicas (`dp`) and the full gradients equal one process's on all rows (the replicated weights' gradients
// summed over the replicas first; the experts' are already whole on their owner).
inline void expect_one_process_loss_and_gradients(CausalLM& split, const DataProto& mine, Communicator& dp) {
  CausalLM whole = expert_model();
  const DataProto all = rl_batch();
  const double tokens = all.tensor("loss_mask").sum().item<double>();
  auto want_loss = globally_weighted_loss(whole, all, tokens);
  want_loss.backward();
  auto loss = globally_weighted_loss(split, mine, tokens);
  loss.backward();
  auto summed = loss.detach().clone();
  dp.all_reduce(summed, ReduceOp::kSum);
  EXPECT_NEAR(summed.item<double>(), want_loss.item<double>(), 1e-5);
  for (auto& item : split->named_parameters())
    if (!is_expert(item.key()) && item.value().grad().defined()) dp.all_reduce(item.value().mutable_grad());
  expect_same_tensors(gather_full_grads(*split), held(grads_by_name(*whole), *split), 1e-5, "gradients");
}

// A training step of a split model took one process's step (one_process_step): loss, gradient norm, tokens and
// the weights this rank holds after it (whole over its tensor-parallel group).
inline void expect_one_process_step(const StepStats& got, const StepResult& want, CausalLMImpl& model,
                                    const std::string& what = "") {
  EXPECT_NEAR(got.loss, want.stats.loss, 1e-5) << what;
  EXPECT_NEAR(got.grad_norm, want.stats.grad_norm, 1e-5) << what;
  EXPECT_EQ(got.tokens, want.stats.tokens) << what;
  expect_same_tensors(gather_full_state(model), held(want.weights, model), 1e-5, what + " weights after the step");
}

// A data-parallel world split into expert-parallel groups of ep consecutive ranks (`experts`), and the ranks at the
// same place in their groups, which own the same experts (`owners`; null when ep is the whole world).
struct ExpertParallelComms {
  ExpertParallelComms(ProcessGroup world, int ep) : group(std::move(world)), dp(group) {
    const int size = group.size();
    std::vector<std::vector<int>> ep_groups, owner_groups(static_cast<size_t>(ep));
    for (int g = 0; g < size / ep; ++g) {
      ep_groups.emplace_back();
      for (int i = 0; i < ep; ++i) {
        ep_groups.back().push_back(g * ep + i);
        owner_groups[static_cast<size_t>(i)].push_back(g * ep + i);
      }
    }
    experts = std::make_unique<Communicator>(ep == size ? group : group.split(ep_groups));
    if (size > ep) owners = std::make_unique<Communicator>(group.split(owner_groups));
  }
  ProcessGroup group;
  Communicator dp;
  std::unique_ptr<Communicator> experts, owners;
};

}  // namespace hybridflow::testing
