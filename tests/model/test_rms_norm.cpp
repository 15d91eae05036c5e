// The decoder's RMSNorm (model/rms_norm.h) on the CPU: transformers' operators, with or without gradients;
// the fused kernel is a GPU training pass's (tests/engine/test_cuda_parity.cpp compares the two there).
#include "hybridflow/model/rms_norm.h"

#include <gtest/gtest.h>

namespace hybridflow {
namespace {

torch::Tensor reference(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  auto h = x.to(torch::kFloat64);
  h = h / (h.pow(2).mean(-1, true) + eps).sqrt();
  return w.to(torch::kFloat64) * h;
}

TEST(RmsNorm, OnTheCpuIsTransformersArithmeticWithOrWithoutGradients) {
  torch::manual_seed(2);
  for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
    auto x = (torch::randn({3, 5, 64}) * 3).to(dtype).requires_grad_();
    auto w = (torch::rand({64}) + 0.5).to(dtype).requires_grad_();
    EXPECT_FALSE(rms_norm_fused_for(x, w));
    const auto y = rms_norm(x, w, 1e-6);
    ASSERT_EQ(y.scalar_type(), dtype);
    // Bit for bit the operators: float32, rounded to the dtype, then times the weight.
    torch::Tensor ops;
    {
      auto h = x.detach().to(torch::kFloat32);
      h = h * torch::rsqrt(h.pow(2).mean(-1, true) + 1e-6);
      ops = w.detach() * h.to(dtype);
    }
    EXPECT_TRUE(torch::equal(y.detach(), ops));
    const double tol = dtype == torch::kFloat32 ? 1e-5 : 2e-2;
    EXPECT_TRUE(torch::allclose(y.detach().to(torch::kFloat64), reference(x.detach(), w.detach(), 1e-6), tol, tol));
    // Gradients flow to both.
    y.to(torch::kFloat32).square().sum().backward();
    EXPECT_TRUE(x.grad().defined() && w.grad().defined());
    EXPECT_GT(w.grad().abs().sum().item<double>(), 0);
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(torch::equal(rms_norm(x, w, 1e-6), ops));
  }
}

}  // namespace
}  // namespace hybridflow
