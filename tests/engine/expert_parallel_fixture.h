// Shared pieces of the multi-process expert-parallel tests: a tiny Qwen3-MoE (2 layers, every one sparse, 4
// experts of width 16 at hidden size 32, top 2; 4 experts split over 2 and 4 ranks), made with the same weights
// in every process.
#pragma once

#include <torch/torch.h>

#include <memory>
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
