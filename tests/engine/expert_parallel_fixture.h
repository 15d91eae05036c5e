// Shared pieces of the multi-process expert-parallel tests: a tiny Qwen3-MoE (2 layers, every one sparse, 4
// experts of width 16 at hidden size 32, top 2; 4 experts split over 2 and 4 ranks), made with the same weights
// in every process.
#pragma once

#include <torch/torch.h>

#include "engine/tensor_parallel_fixture.h"

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

}  // namespace hybridflow::testing
