// The fused decode kernels of kernels/decode_fusions.h (their CPU references: the arithmetic of their CUDA
// kernels) against the calls they replace: the q/k norms, rotary embeddings and cache writes of the fused decode
// step before them (decode_kernels.h's kernels and index_copy_), bit for bit, and the model's unfused operators
// within a rounding of the dtype; over GQA, shuffled block tables, with and without Qwen3's norms, in fp32, bf16
// and fp16. The GPU parity of the CUDA kernel is in tests/engine/test_cuda_parity.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <tuple>
#include <vector>

#include "hybridflow/core/error.h"
#include "hybridflow/kernels/decode_fusions.h"
#include "support/decode_fusion_oracles.h"

namespace hybridflow {
namespace {

double fusion_tolerance(torch::Dtype t) { return t == torch::kFloat32 ? 1e-5 : t == torch::kBFloat16 ? 4e-2 : 5e-3; }

TEST(DecodeFusions, QkNormRotaryCacheWriteEqualsTheSeparateKernelsAndTheOperators) {
  torch::manual_seed(11);
  const double eps = 1e-6;
  for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16, torch::kHalf}) {
    for (bool norms : {true, false}) {
      for (auto [heads, kv, dim] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{6, 2, 16}, {4, 4, 40}}) {
        const std::string what = std::string(c10::toString(dtype)) + (norms ? " with norms" : " without norms") +
                                 " heads " + std::to_string(heads) + "/" + std::to_string(kv) + " dim " +
                                 std::to_string(dim);
        const auto base = testing::qk_cache_case({0, 3, 4, 13, 7}, heads, kv, dim, 4, norms, dtype);
        auto fused = base.clone(), separate = base.clone(), unfused = base.clone();
        const auto q = testing::fused_qk_norm_rotary_cache_write(fused, eps);
        ASSERT_EQ(q.sizes(), base.q.sizes()) << what;
        ASSERT_EQ(q.scalar_type(), dtype) << what;
        // Bit for bit the kernels it replaces, every pool position included (those not written stay).
        EXPECT_TRUE(torch::equal(q, testing::separate_qk_kernels_and_cache_writes(separate, eps))) << what;
        EXPECT_TRUE(torch::equal(fused.key_pool, separate.key_pool)) << what;
        EXPECT_TRUE(torch::equal(fused.value_pool, separate.value_pool)) << what;
        EXPECT_FALSE(torch::equal(fused.key_pool, base.key_pool)) << what << ": nothing written";
        // The operators: the norm's reduction order and the fp32 path of its scale may round the other way.
        const auto reference = testing::unfused_qk_operators_and_cache_writes(unfused, eps);
        const double tol = fusion_tolerance(dtype);
        EXPECT_TRUE(torch::allclose(q.to(torch::kFloat32), reference.to(torch::kFloat32), tol, tol))
            << what << " max diff " << (q.to(torch::kFloat32) - reference.to(torch::kFloat32)).abs().max().item<double>();
        EXPECT_TRUE(torch::allclose(fused.key_pool.to(torch::kFloat32), unfused.key_pool.to(torch::kFloat32), tol, tol))
            << what;
        EXPECT_TRUE(torch::equal(fused.value_pool, unfused.value_pool)) << what;
      }
    }
  }
}

TEST(DecodeFusions, RotaryTablesEqualRotaryCosSinsOperators) {
  // Positions up to Qwen3's 40960, so the angles reach the arguments where a cosine's range reduction matters.
  const auto positions = torch::tensor({0, 1, 7, 991, 1023, 4097, 40959}, torch::kInt64);
  for (int64_t head_dim : {int64_t{16}, int64_t{128}}) {
    const auto inv_freq = testing::qwen3_inv_freq(head_dim);
    for (double scaling : {1.0, 1.2}) {
      for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16, torch::kHalf}) {
        const std::string what = std::string(c10::toString(dtype)) + " head_dim " + std::to_string(head_dim) +
                                 " scaling " + std::to_string(scaling);
        const auto fused = kernels::rotary_tables(positions, inv_freq, scaling, dtype);
        const auto [cos, sin] = testing::unfused_rotary_tables(positions, inv_freq, scaling, dtype);
        ASSERT_EQ(fused.cos.sizes(), (std::vector<int64_t>{positions.size(0), head_dim})) << what;
        ASSERT_EQ(fused.cos.scalar_type(), dtype) << what;
        // libm's cosine against libtorch's vectorised one: a last fp32 bit, or one rounding of the dtype.
        const double tol = dtype == torch::kFloat32 ? 1e-6 : dtype == torch::kBFloat16 ? 8e-3 : 1e-3;
        EXPECT_TRUE(torch::allclose(fused.cos.to(torch::kFloat32), cos.to(torch::kFloat32), tol, tol)) << what;
        EXPECT_TRUE(torch::allclose(fused.sin.to(torch::kFloat32), sin.to(torch::kFloat32), tol, tol)) << what;
      }
    }
  }
}

TEST(DecodeFusions, QkNormRotaryCacheWriteRefusesBadInputsByName) {
  auto c = testing::qk_cache_case({2, 5}, 4, 2, 8, 4, true, torch::kFloat32);
  auto expect_error = [&](const std::string& needle, auto&& call) {
    try {
      call();
      FAIL() << "expected an error naming '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("kernels::rotary_tables: expected positions [rows] int64", [&] {
    kernels::rotary_tables(torch::zeros({2, 1}, torch::kInt64), testing::qwen3_inv_freq(8), 1.0, torch::kFloat32);
  });
  expect_error("q_norm and k_norm must be given together", [&] {
    kernels::qk_norm_rotary_cache_write(c.q, c.k, c.v, c.q_norm, torch::Tensor(), 1e-6, c.cos, c.sin, c.key_pool,
                                        c.value_pool, c.tables, c.lengths);
  });
  expect_error("every operand must be a Float", [&] {
    kernels::qk_norm_rotary_cache_write(c.q, c.k.to(torch::kFloat64), c.v, c.q_norm, c.k_norm, 1e-6, c.cos, c.sin,
                                        c.key_pool, c.value_pool, c.tables, c.lengths);
  });
  expect_error("expected cos and sin [2, 8]", [&] {
    kernels::qk_norm_rotary_cache_write(c.q, c.k, c.v, c.q_norm, c.k_norm, 1e-6, c.cos.narrow(1, 0, 4),
                                        c.sin.narrow(1, 0, 4), c.key_pool, c.value_pool, c.tables, c.lengths);
  });
  expect_error("row 1 writes position 9 past its table", [&] {
    kernels::qk_norm_rotary_cache_write(c.q, c.k, c.v, c.q_norm, c.k_norm, 1e-6, c.cos, c.sin, c.key_pool,
                                        c.value_pool, c.tables, torch::tensor({2, 9}, torch::kInt64));
  });
  auto bad_tables = c.tables.clone();
  bad_tables[0][0] = c.key_pool.size(0);
  expect_error("row 0 names block", [&] {
    kernels::qk_norm_rotary_cache_write(c.q, c.k, c.v, c.q_norm, c.k_norm, 1e-6, c.cos, c.sin, c.key_pool,
                                        c.value_pool, bad_tables, c.lengths);
  });
}

}  // namespace
}  // namespace hybridflow
