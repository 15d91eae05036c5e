// The rotary embedding as one kernel each way (model/rotary_rows.h) through the kernel's CPU reference
// (kernels::Mode::kEverywhere; on CUDA tensors its CUDA kernel): values and gradients bit for bit the operators'
// x * cos + rotate_half(x) * sin, in fp32, bf16 and fp16, with per-row and shared position tables, and a whole
// model's logits and every gradient bit for bit the operators' with it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "hybridflow/kernels/decode_kernels.h"
#include "hybridflow/model/rotary.h"
#include "hybridflow/model/transformer.h"
#include "model/rotary_rows.h"
#include "support/operator_counter.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

class RotaryRowsTest : public ::testing::Test {
 protected:
  void TearDown() override { kernels::set_mode(saved_); }

 private:
  kernels::Mode saved_ = kernels::mode();
};

// The operators on x [B, T, heads, d] with cos, sin [B or 1, 1, T, d] (the heads' axis after T here).
torch::Tensor operators(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const auto rotated = torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
  return x * cos.transpose(1, 2) + rotated * sin.transpose(1, 2);
}

TEST_F(RotaryRowsTest, ValuesAndGradientsAreTheOperatorsBitForBit) {
  torch::manual_seed(9);
  const ModelConfig config = testing::tiny_model_config({.vocab_size = 40, .hidden_size = 48, .num_attention_heads = 3}, "qwen3-tiny");
  kernels::set_mode(kernels::Mode::kEverywhere);
  for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16, torch::kHalf}) {
    for (bool shared_positions : {false, true}) {
      const int64_t b = 2, t = 5, heads = 3, d = config.head_dim();
      const auto positions = shared_positions ? torch::arange(t, torch::kInt64).unsqueeze(0)
                                              : torch::randint(0, 300, {b, t}, torch::kInt64);
      const auto [cos, sin] = rotary_cos_sin(positions, config, dtype);
      const auto x0 = (torch::randn({b, t, heads, d}) * 2).to(dtype);
      const auto g = torch::randn({b, t, heads, d}).to(dtype);
      const std::string what = std::string(c10::toString(dtype)) + (shared_positions ? " shared" : " per row");
      ASSERT_TRUE(rotary_rows_apply(x0, cos, sin)) << what;
      auto x = x0.clone().requires_grad_(), x_ops = x0.clone().requires_grad_();
      const auto y = rotary_rows(x, cos, sin);
      const auto y_ops = operators(x_ops, cos, sin);
      EXPECT_TRUE(torch::equal(y, y_ops)) << what;
      y.backward(g);
      y_ops.backward(g);
      EXPECT_TRUE(torch::equal(x.grad(), x_ops.grad())) << what;
      EXPECT_FALSE(torch::equal(x.grad(), g)) << what << ": the gradient went through the rotation";
    }
  }
}

TEST_F(RotaryRowsTest, AppliesWhereTheKernelsRunAndTheShapesFit) {
  const ModelConfig config = testing::tiny_model_config({.vocab_size = 40, .hidden_size = 48, .num_attention_heads = 3}, "qwen3-tiny");
  const auto [cos, sin] = rotary_cos_sin(torch::arange(5, torch::kInt64).unsqueeze(0), config, torch::kFloat32);
  const auto x = torch::randn({2, 5, 3, config.head_dim()});
  kernels::set_mode(kernels::Mode::kCuda);
  EXPECT_FALSE(rotary_rows_apply(x, cos, sin)) << "the CPU where the kernels run only on CUDA";
  kernels::set_mode(kernels::Mode::kEverywhere);
  EXPECT_TRUE(rotary_rows_apply(x, cos, sin));
  EXPECT_FALSE(rotary_rows_apply(x.transpose(1, 2), cos, sin)) << "another layout";
  EXPECT_FALSE(rotary_rows_apply(x.to(torch::kFloat64), cos, sin)) << "float64";
  EXPECT_FALSE(rotary_rows_apply(x, cos.clone().requires_grad_(), sin)) << "tables with gradients";
  EXPECT_FALSE(rotary_rows_apply(x.narrow(1, 0, 4).contiguous(), cos, sin)) << "another length";
  EXPECT_THROW(rotary_rows(x.transpose(1, 2), cos, sin), std::exception);
}

// A whole training pass with the kernel equals the operators': logits and every parameter's gradient, bit for
// bit (bf16, Qwen3's q/k norms and grouped-query heads, a left-padded row).
TEST_F(RotaryRowsTest, AModelsPassAndGradientsAreTheOperatorsBitForBit) {
  ModelConfig config = testing::tiny_model_config({.vocab_size = 41, .hidden_size = 32, .intermediate_size = 48,
                                                   .num_attention_heads = 4, .num_key_value_heads = 2},
                                                  "qwen3-tiny");
  torch::manual_seed(10);
  CausalLM model(config);
  model->to(torch::kBFloat16);
  const auto ids = torch::randint(0, 41, {2, 9}, torch::kInt64);
  auto mask = torch::ones({2, 9}, torch::kInt64);
  mask[1].narrow(0, 0, 3).zero_();
  auto run = [&](kernels::Mode mode) {
    kernels::set_mode(mode);
    model->zero_grad();
    testing::OperatorCounter counter;
    const auto logits = model->forward(ids, mask).logits;
    logits.to(torch::kFloat32).pow(2).mean().backward();
    // q and k of each layer, forward and backward, through the kernel with the kernels on; never without.
    EXPECT_EQ(counter.named_calls("hybridflow::rotary"),
              mode == kernels::Mode::kOff ? 0 : 4 * config.num_hidden_layers);
    std::vector<torch::Tensor> grads = {logits.detach()};
    for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  const auto fused = run(kernels::Mode::kEverywhere);
  const auto ops = run(kernels::Mode::kOff);
  ASSERT_EQ(fused.size(), ops.size());
  for (size_t i = 0; i < fused.size(); ++i)
    EXPECT_TRUE(torch::equal(fused[i], ops[i])) << (i == 0 ? "logits" : "gradient " + std::to_string(i - 1));
}

}  // namespace
}  // namespace hybridflow
