// Activation checkpointing: the recomputed backward gives the gradients of the plain one (a function of one
// tensor, and a whole CausalLM with checkpointed decoder layers), runs the function again, and keeps less
// memory alive between the forward and the backward.
#include "hybridflow/model/activation_checkpoint.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hybridflow/core/cpu_memory.h"
#include "hybridflow/model/transformer.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

TEST(ActivationCheckpoint, RecomputesAndGivesThePlainGradients) {
  torch::manual_seed(0);
  torch::nn::Linear a(6, 8), b(8, 6);
  int calls = 0;
  TensorFn fn = [&](const torch::Tensor& x) {
    ++calls;
    return b(torch::tanh(a(x))) + x;
  };
  auto input = torch::randn({4, 6});
  auto plain_x = input.clone().set_requires_grad(true);
  fn(plain_x).pow(2).sum().backward();
  std::vector<torch::Tensor> plain = {plain_x.grad(), a->weight.grad().clone(), b->weight.grad().clone()};
  a->zero_grad();
  b->zero_grad();
  calls = 0;
  auto x = input.clone().set_requires_grad(true);
  auto y = checkpointed(fn, x);
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(y.grad_fn() == nullptr);
  y.pow(2).sum().backward();
  EXPECT_EQ(calls, 2);  // once more in the backward pass
  EXPECT_TRUE(torch::allclose(x.grad(), plain[0], 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(a->weight.grad(), plain[1], 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(b->weight.grad(), plain[2], 1e-6, 1e-6));
  // Without gradients (or an input that needs none) it is a plain call.
  calls = 0;
  {
    torch::NoGradGuard no_grad;
    checkpointed(fn, x);
  }
  checkpointed(fn, input);
  EXPECT_EQ(calls, 2);
}

ModelConfig config(int64_t layers) {
  return testing::tiny_model_config({.vocab_size = 50,
                                     .hidden_size = 32,
                                     .intermediate_size = 96,
                                     .num_hidden_layers = layers,
                                     .max_position_embeddings = 256});
}

std::vector<torch::Tensor> grads_after_loss(CausalLM& model, const torch::Tensor& ids, const torch::Tensor& mask) {
  model->zero_grad();
  auto logits = model->forward(ids, mask).logits;
  torch::log_softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).mean().backward();
  std::vector<torch::Tensor> g;
  for (auto& p : model->parameters()) g.push_back(p.grad().clone());
  return g;
}

TEST(ActivationCheckpoint, CheckpointedDecoderLayersGiveTheSameGradients) {
  torch::manual_seed(1);
  CausalLM model(config(3));
  auto ids = torch::randint(0, 50, {3, 10}, torch::kLong);
  auto mask = torch::ones({3, 10}, torch::kLong);
  mask[1].narrow(0, 0, 3).zero_();
  const auto plain = grads_after_loss(model, ids, mask);
  model->set_gradient_checkpointing(true);
  const auto recomputed = grads_after_loss(model, ids, mask);
  ASSERT_EQ(plain.size(), recomputed.size());
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_TRUE(torch::allclose(plain[i], recomputed[i], 1e-6, 1e-7))
        << "parameter " << i << ": max difference " << (plain[i] - recomputed[i]).abs().max().item<double>();
  // Inference and generation (a KV cache) are unaffected.
  torch::NoGradGuard no_grad;
  KVCache cache;
  auto with_cache = model->forward(ids, mask, {}, &cache).logits;
  model->set_gradient_checkpointing(false);
  EXPECT_TRUE(torch::allclose(with_cache, model->forward(ids, mask).logits, 1e-6, 1e-6));
}

// Between forward and backward a plain model keeps every layer's activations; a checkpointed one keeps the
// layer inputs. Measured with the CPU allocator's peak over forward + backward.
TEST(ActivationCheckpoint, KeepsLessMemoryAliveThanThePlainBackward) {
  torch::manual_seed(2);
  CausalLM model(config(6));
  auto ids = torch::randint(0, 50, {4, 128}, torch::kLong);
  auto mask = torch::ones({4, 128}, torch::kLong);
  auto peak = [&](bool on) {
    model->set_gradient_checkpointing(on);
    model->zero_grad();
    return peak_cpu_bytes_during([&] { grads_after_loss(model, ids, mask); });
  };
  peak(false);  // parameter gradients exist from here on in both measurements
  const int64_t plain = peak(false), recomputed = peak(true);
  EXPECT_LT(recomputed, plain * 2 / 3) << "plain " << plain << " bytes, checkpointed " << recomputed;
}

}  // namespace
}  // namespace hybridflow
