// Shared pieces of the multi-process tensor-parallel tests: a tiny Llama that splits over 1, 2 and 4 ranks
// (4 query heads, 2 KV heads: 4 ranks replicate k/v), its weights made identically in every process, a
// batch of prompt + response rows with left and right padding, and full-tensor gathers of a split model.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "hybridflow/core/data_proto.h"
#include "hybridflow/engine/model_log_probs.h"
#include "hybridflow/engine/train_engine.h"
#include "hybridflow/model/tensor_parallel_layout.h"
#include "hybridflow/model/transformer.h"
#include "support/tiny_model.h"

namespace hybridflow::testing {

inline ModelConfig tensor_parallel_test_config() {
  ModelConfig c = tiny_model_config({.vocab_size = 64, .max_position_embeddings = 128});
  c.attention_bias = true;  // q/k/v biases are split, Llama's o_proj bias is replicated
  return c;
}

// Qwen3's per-head q/k norms see only a rank's heads, so their gradients are partial on each rank; heads
// wider than hidden_size / heads; 2 KV heads, replicated (not split) at tp = 4.
inline ModelConfig qwen3_tensor_parallel_test_config() {
  ModelConfig c = tensor_parallel_test_config();
  c.architecture = "Qwen3ForCausalLM";
  c.model_type = "qwen3";
  c.explicit_head_dim = 12;
  return c;
}

// The same weights in every process (a fixed seed), as one process would hold them.
inline CausalLM reference_model(HeadKind head, uint64_t seed = 1234,
                                const ModelConfig& config = tensor_parallel_test_config()) {
  torch::manual_seed(seed);
  return CausalLM(config, head);
}

inline std::map<std::string, torch::Tensor> parameters_of(CausalLMImpl& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model.named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

// Full gradients of a split model, gathered over its tensor-parallel group like gather_full_state.
inline std::map<std::string, torch::Tensor> gather_full_grads(CausalLMImpl& model) {
  std::map<std::string, torch::Tensor> grads;
  for (const auto& item : model.named_parameters()) {
    torch::Tensor g = item.value().grad();
    grads[item.key()] = g.defined() ? g : torch::zeros_like(item.value());
  }
  return gather_full_tensors(grads, model.config(), model.tensor_parallel());
}

inline void expect_same_tensors(const std::map<std::string, torch::Tensor>& got,
                                const std::map<std::string, torch::Tensor>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, w] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << what << ": no " << name;
    ASSERT_EQ(it->second.sizes(), w.sizes()) << what << ": " << name;
    EXPECT_TRUE(torch::allclose(it->second, w, tol, tol))
        << what << ": " << name << " differs by " << (it->second - w).abs().max().item<double>();
  }
}

constexpr int64_t kPromptLen = 3;
constexpr int64_t kResponseLen = 5;

// 4 rows of prompt (left padded) + response (right padded), with PPO's inputs.
inline DataProto rl_batch() {
  torch::manual_seed(99);
  const int64_t rows = 4, len = kPromptLen + kResponseLen;
  auto ids = torch::randint(0, 64, {rows, len}, torch::kLong);
  auto mask = torch::ones({rows, len}, torch::kLong);
  mask[1][0] = 0;          // a left-padded prompt
  mask[2][len - 1] = 0;    // a response that ended early
  mask[2][len - 2] = 0;
  DataProto batch;
  batch.set_tensor("input_ids", ids);
  batch.set_tensor("attention_mask", mask);
  batch.set_tensor("loss_mask", mask.narrow(1, kPromptLen, kResponseLen).to(torch::kFloat));
  batch.set_tensor("old_log_probs", torch::randn({rows, kResponseLen}) * 0.1 - 4.2);
  batch.set_tensor("advantages", torch::randn({rows, kResponseLen}));
  batch.set_tensor("returns", torch::randn({rows, kResponseLen}));
  return batch;
}

inline torch::Tensor masked_token_mean(const torch::Tensor& x, const torch::Tensor& mask) {
  return (x * mask).sum() / mask.sum();
}

// PPO's clipped surrogate with an entropy bonus, over the response tokens of rl_batch() rows.
inline torch::Tensor policy_loss(CausalLM& model, const DataProto& m) {
  auto out = response_log_probs(model, m.tensor("input_ids"), m.tensor("attention_mask"), kResponseLen);
  auto ratio = torch::exp(out.log_probs - m.tensor("old_log_probs"));
  const auto& adv = m.tensor("advantages");
  auto surrogate = -torch::min(ratio * adv, torch::clamp(ratio, 0.8, 1.2) * adv);
  return masked_token_mean(surrogate - 0.01 * out.entropy, m.tensor("loss_mask"));
}

// The squared error of the values that predict rl_batch()'s response tokens.
inline torch::Tensor value_loss(CausalLM& model, const DataProto& m) {
  auto values = model->forward(m.tensor("input_ids"), m.tensor("attention_mask")).values;
  auto predicted = values.narrow(1, kPromptLen - 1, kResponseLen);
  return masked_token_mean((predicted - m.tensor("returns")).pow(2), m.tensor("loss_mask"));
}

// AdamW whose first step clips (the tests' gradient norms exceed 0.5).
inline OptimizerOptions parallel_test_optimizer() {
  OptimizerOptions o;
  o.schedule.lr = 1e-3;
  o.eps = 1e-4;  // keeps Adam's first step away from sign(g) for gradients that round differently
  o.grad_clip = 0.5;
  return o;
}

// One training step's statistics with the full gradients and updated weights it left.
struct StepResult {
  StepStats stats;
  std::map<std::string, torch::Tensor> grads, weights;
};

using ModelLossFn = torch::Tensor (*)(CausalLM&, const DataProto&);

// One process's step of `loss` on the whole of rl_batch(), one row per micro-batch: what the parallel
// layouts must reproduce.
inline StepResult one_process_step(CausalLM model, ModelLossFn loss) {
  TrainEngine engine(model.ptr(), parallel_test_optimizer());
  StepResult r;
  r.stats = engine.train_step(rl_batch(), 1, [&](const DataProto& m) { return loss(model, m); });
  r.grads = gather_full_grads(*model);
  r.weights = parameters_of(*model);
  return r;
}

}  // namespace hybridflow::testing
