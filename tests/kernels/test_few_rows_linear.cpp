// The few-rows projection kernels of kernels/few_rows_linear.h through their CPU references (the CUDA kernel's
// arithmetic in its order): the product within the rounding its fp32 sum and the dtype allow, several
// projections in one call equal to one call each bit for bit, SwiGLU of the gate and up projections equal to
// kernels::swiglu of the two, the refusals, and where the decode step takes them. The CUDA kernel's equality with
// these references, bit for bit, is in tests/engine/test_cuda_parity.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "hybridflow/core/error.h"
#include "hybridflow/kernels/decode_kernels.h"
#include "hybridflow/kernels/few_rows_linear.h"

namespace hybridflow {
namespace {

// Restores the switch and the kernels' mode after a test that sets them.
class FewRowsLinearTest : public ::testing::Test {
 protected:
  void TearDown() override {
    kernels::set_few_rows_linear_enabled(saved_enabled_);
    kernels::set_mode(saved_mode_);
  }

 private:
  bool saved_enabled_ = kernels::few_rows_linear_enabled();
  kernels::Mode saved_mode_ = kernels::mode();
};

// The unit roundoff of the dtype's storage (half an ulp relative).
double storage_roundoff(torch::Dtype t) {
  return t == torch::kBFloat16 ? std::ldexp(1.0, -8) : t == torch::kHalf ? std::ldexp(1.0, -11) : 0.0;
}

// Asserts |out - x w^T - b| within what the kernel's sum may lose (each lane's k / 32 sums, then five of the
// butterfly, each losing 2^-24 of the absolute products' sum at most) and one rounding to the dtype.
void expect_product(const torch::Tensor& out, const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                    const std::string& what) {
  const auto x64 = x.to(torch::kFloat64), w64 = w.to(torch::kFloat64);
  auto exact = torch::matmul(x64, w64.t());
  auto magnitude = torch::matmul(x64.abs(), w64.abs().t());
  if (b.defined()) {
    exact = exact + b.to(torch::kFloat64);
    magnitude = magnitude + b.to(torch::kFloat64).abs();
  }
  const double sums = static_cast<double>(x.size(1) / 32 + 8);
  const auto bound = magnitude * (2.0 * sums * std::ldexp(1.0, -24)) * (1.0 + storage_roundoff(x.scalar_type())) +
                     exact.abs() * storage_roundoff(x.scalar_type()) + 1e-30;
  const auto excess = ((out.to(torch::kFloat64) - exact).abs() - bound).max().item<double>();
  EXPECT_LE(excess, 0.0) << what;
}

TEST_F(FewRowsLinearTest, ReferenceIsTheProductWithinItsRounding) {
  torch::manual_seed(3);
  for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16, torch::kHalf}) {
    for (int64_t rows : {1, 2, 3, 5, 8}) {
      for (auto [k, n] : std::vector<std::tuple<int64_t, int64_t>>{{24, 7}, {64, 40}, {1032, 9}}) {
        for (bool bias : {false, true}) {
          const std::string what = std::string(c10::toString(dtype)) + " rows " + std::to_string(rows) + " k " +
                                   std::to_string(k) + " n " + std::to_string(n) + (bias ? " with bias" : "");
          const auto x = torch::randn({rows, k}).to(dtype);
          const auto w = (torch::randn({n, k}) / std::sqrt(static_cast<double>(k))).to(dtype);
          const auto b = bias ? torch::randn({n}).to(dtype) : torch::Tensor();
          const auto out = kernels::few_rows_linear(x, {w}, {b});
          ASSERT_EQ(out.size(), 1u) << what;
          ASSERT_EQ(out[0].sizes(), (std::vector<int64_t>{rows, n})) << what;
          ASSERT_EQ(out[0].scalar_type(), dtype) << what;
          expect_product(out[0], x, w, b, what);
          // float_out: the same values, stored in float32.
          const auto wide = kernels::few_rows_linear(x, {w}, {b}, /*float_out=*/true);
          ASSERT_EQ(wide[0].scalar_type(), torch::kFloat32) << what;
          EXPECT_TRUE(torch::equal(wide[0], out[0].to(torch::kFloat32))) << what;
        }
      }
    }
  }
}

TEST_F(FewRowsLinearTest, PartsInOneCallEqualOneCallEach) {
  torch::manual_seed(4);
  for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
    const int64_t rows = 3, k = 48;
    const auto x = torch::randn({rows, k}).to(dtype);
    const std::vector<torch::Tensor> weights = {torch::randn({16, k}).to(dtype), torch::randn({8, k}).to(dtype),
                                                torch::randn({8, k}).to(dtype)};
    const std::vector<torch::Tensor> biases = {torch::randn({16}).to(dtype), torch::Tensor(),
                                               torch::randn({8}).to(dtype)};
    const auto together = kernels::few_rows_linear(x, weights, biases);
    ASSERT_EQ(together.size(), 3u);
    for (size_t i = 0; i < weights.size(); ++i) {
      const auto alone = kernels::few_rows_linear(x, {weights[i]}, {biases[i]});
      EXPECT_TRUE(torch::equal(together[i], alone[0])) << c10::toString(dtype) << " part " << i;
    }
    // A bias shifts its part's outputs and no other's.
    const auto unbiased = kernels::few_rows_linear(x, weights);
    EXPECT_FALSE(torch::equal(together[0], unbiased[0]));
    EXPECT_TRUE(torch::equal(together[1], unbiased[1]));
  }
}

TEST_F(FewRowsLinearTest, SwigluEqualsSwigluOfTheTwoProjections) {
  torch::manual_seed(5);
  for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16, torch::kHalf}) {
    for (int64_t rows : {1, 4, 7}) {
      const int64_t k = 64, n = 24;
      const auto x = torch::randn({rows, k}).to(dtype);
      const auto gate = (torch::randn({n, k}) / 8).to(dtype), up = (torch::randn({n, k}) / 8).to(dtype);
      const auto fused = kernels::few_rows_swiglu(x, gate, up);
      const auto projected = kernels::few_rows_linear(x, {gate, up});
      EXPECT_TRUE(torch::equal(fused, kernels::swiglu(projected[0], projected[1])))
          << c10::toString(dtype) << " rows " << rows;
      // And the model's operators within the dtype's rounding.
      const auto xf = x.to(torch::kFloat32);
      const auto operators = torch::silu(torch::linear(xf, gate.to(torch::kFloat32))) * torch::linear(xf, up.to(torch::kFloat32));
      const double tol = dtype == torch::kFloat32 ? 1e-5 : dtype == torch::kBFloat16 ? 3e-2 : 4e-3;
      EXPECT_TRUE(torch::allclose(fused.to(torch::kFloat32), operators, tol, tol)) << c10::toString(dtype);
    }
  }
}

TEST_F(FewRowsLinearTest, RefusesWhatItCannotTake) {
  const auto w = torch::randn({4, 16});
  const auto expect_error = [](const std::function<void()>& call, const std::string& words) {
    try {
      call();
      ADD_FAILURE() << "no error; expected one naming " << words;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  expect_error([&] { kernels::few_rows_linear(torch::randn({9, 16}), {w}); }, "1 to 8 rows");
  expect_error([&] { kernels::few_rows_linear(torch::randn({2, 12}).to(torch::kBFloat16), {w.narrow(1, 0, 12)}); },
               "multiple of 8");
  expect_error([&] { kernels::few_rows_linear(torch::randn({2, 16}), {w.to(torch::kBFloat16)}); }, "weight 0");
  expect_error([&] { kernels::few_rows_linear(torch::randn({2, 16}), {w}, {torch::randn({5})}); }, "bias 0");
  expect_error([&] { kernels::few_rows_linear(torch::randn({2, 16}), {w, w, w, w}); }, "one to three weights");
  expect_error([&] { kernels::few_rows_swiglu(torch::randn({2, 16}), w, torch::randn({5, 16})); }, "one shape");
}

TEST_F(FewRowsLinearTest, AppliesWhereSwitchedOnAndShapedForIt) {
  const auto x = torch::randn({2, 16}), w = torch::randn({4, 16});
  kernels::set_mode(kernels::Mode::kEverywhere);
  kernels::set_few_rows_linear_enabled(false);
  EXPECT_FALSE(kernels::few_rows_linear_applies(x, {w})) << "switched off";
  kernels::set_few_rows_linear_enabled(true);
  EXPECT_TRUE(kernels::few_rows_linear_applies(x, {w}));
  EXPECT_TRUE(kernels::few_rows_linear_applies(x, {w, w.narrow(0, 0, 2)}));
  EXPECT_FALSE(kernels::few_rows_linear_applies(torch::randn({9, 16}), {w})) << "more rows than it takes";
  EXPECT_FALSE(kernels::few_rows_linear_applies(x, {torch::randn({16, 4}).t()})) << "a transposed weight";
  EXPECT_FALSE(kernels::few_rows_linear_applies(x, {torch::randn({4, 12})})) << "another k";
  EXPECT_FALSE(kernels::few_rows_linear_applies(x, {w.to(torch::kFloat64)})) << "float64";
  EXPECT_FALSE(kernels::few_rows_linear_applies(torch::randn({2, 14}), {torch::randn({4, 14})}))
      << "k not a whole number of 16-byte vectors";
  const auto misaligned = torch::randn({1 + 2 * 16}).narrow(0, 1, 2 * 16).view({2, 16});
  EXPECT_FALSE(kernels::few_rows_linear_applies(misaligned, {w})) << "input off a 16-byte boundary";
  // Where the decode kernels run only on CUDA, a CPU tensor is not theirs.
  kernels::set_mode(kernels::Mode::kCuda);
  EXPECT_FALSE(kernels::few_rows_linear_applies(x, {w}));
}

}  // namespace
}  // namespace hybridflow
