// The fused decode kernels' CPU references (the arithmetic their CUDA kernels compute) against the unfused
// operators the model runs otherwise: RMSNorm, the residual add before it, SwiGLU and the rotary embedding in
// fp32, bf16 and fp16, and the paged decode attention against gathered keys and values through
// scaled_dot_product_attention, over shuffled block tables, GQA, sliding windows and KV lengths split into many
// partitions. The GPU parity of the CUDA kernels themselves is in tests/engine/test_cuda_parity.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "hybridflow/core/error.h"
#include "hybridflow/kernels/decode_kernels.h"
#include "support/decode_kernel_oracles.h"

namespace hybridflow {
namespace {

using testing::paged_case;
using testing::unfused_rms_norm;

const std::vector<torch::Dtype> kDtypes = {torch::kFloat32, torch::kBFloat16, torch::kFloat16};

std::string name(torch::Dtype t) { return c10::toString(t); }

// Tolerances of one rounding in the dtype (a reduction or exp may round the other way near a tie).
double tolerance(torch::Dtype t) { return t == torch::kFloat32 ? 1e-6 : t == torch::kBFloat16 ? 8e-3 : 1e-3; }

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat32) - b.to(torch::kFloat32)).abs().max().item<double>();
}

TEST(DecodeKernels, RmsNormAndResidualAddEqualTheUnfusedOperators) {
  torch::manual_seed(1);
  for (auto dtype : kDtypes) {
    const auto x = torch::randn({5, 3, 96}).to(dtype), delta = torch::randn({5, 3, 96}).to(dtype);
    const auto weight = (1 + 0.1 * torch::randn({96})).to(dtype);
    const double eps = 1e-6;
    auto fused = kernels::rms_norm(x, weight, eps);
    auto unfused = unfused_rms_norm(x, weight, eps);
    ASSERT_EQ(fused.scalar_type(), dtype);
    ASSERT_EQ(fused.sizes(), x.sizes());
    EXPECT_TRUE(torch::allclose(fused.to(torch::kFloat32), unfused.to(torch::kFloat32), tolerance(dtype),
                                tolerance(dtype)))
        << name(dtype) << " max diff " << max_diff(fused, unfused);
    // The sum rounds once, as the unfused add: bit for bit; the norm of it as above.
    auto both = kernels::add_rms_norm(x, delta, weight, eps);
    EXPECT_TRUE(torch::equal(both.sum, x + delta)) << name(dtype);
    auto normed = unfused_rms_norm(x + delta, weight, eps);
    EXPECT_TRUE(torch::allclose(both.normed.to(torch::kFloat32), normed.to(torch::kFloat32), tolerance(dtype),
                                tolerance(dtype)))
        << name(dtype) << " max diff " << max_diff(both.normed, normed);
  }
}

TEST(DecodeKernels, SwigluEqualsSiluTimesUp) {
  torch::manual_seed(2);
  for (auto dtype : kDtypes) {
    const auto gate = (3 * torch::randn({7, 1, 200})).to(dtype), up = torch::randn({7, 1, 200}).to(dtype);
    auto fused = kernels::swiglu(gate, up);
    auto unfused = torch::silu(gate) * up;
    ASSERT_EQ(fused.scalar_type(), dtype);
    ASSERT_EQ(fused.sizes(), gate.sizes());
    EXPECT_TRUE(torch::allclose(fused.to(torch::kFloat32), unfused.to(torch::kFloat32), tolerance(dtype),
                                tolerance(dtype)))
        << name(dtype) << " max diff " << max_diff(fused, unfused);
  }
}

TEST(DecodeKernels, RotaryEqualsRotateHalfBitForBit) {
  torch::manual_seed(3);
  for (auto dtype : kDtypes) {
    const int64_t rows = 4, heads = 6, dim = 16;
    const auto x = torch::randn({rows, heads, dim}).to(dtype);
    const auto angles = torch::rand({rows, dim}) * 10;
    const auto cos = angles.cos().to(dtype), sin = angles.sin().to(dtype);
    auto fused = kernels::rotary(x, cos, sin);
    // The model's layout: cos and sin [rows, 1, d] broadcast over the heads.
    auto unfused = x * cos.unsqueeze(1) + testing::rotate_half(x) * sin.unsqueeze(1);
    EXPECT_TRUE(torch::equal(fused, unfused)) << name(dtype) << " max diff " << max_diff(fused, unfused);
  }
}

TEST(DecodeKernels, PagedDecodeAttentionEqualsGatheredSdpa) {
  torch::manual_seed(4);
  const int64_t dim = 32;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  // Lengths from one position to many partitions; GQA of 3 and none; with and without a window shorter than rows.
  for (auto [heads, kv] : std::vector<std::pair<int64_t, int64_t>>{{6, 2}, {4, 4}}) {
    for (int64_t window : {int64_t{0}, int64_t{9}}) {
      for (auto dtype : kDtypes) {
        const auto c = paged_case({0, 5, 37, 70, 12}, heads, kv, dim, 4, dtype);
        const std::string what = name(dtype) + " heads " + std::to_string(heads) + "/" + std::to_string(kv) +
                                 " window " + std::to_string(window);
        auto reference = testing::unfused_paged_attention(c, scale, window);
        for (int64_t partition : {int64_t{4}, int64_t{16}, int64_t{0}}) {
          auto fused = kernels::paged_decode_attention(c.q, c.key_pool, c.value_pool, c.tables, c.lengths, c.span,
                                                       scale, window, partition);
          ASSERT_EQ(fused.scalar_type(), dtype) << what;
          ASSERT_EQ(fused.sizes(), c.q.sizes()) << what;
          // fp32: summation order only; bf16/fp16: the output's one rounding.
          const double tol = dtype == torch::kFloat32 ? 1e-5 : tolerance(dtype);
          EXPECT_TRUE(torch::allclose(fused.to(torch::kFloat32), reference, tol, tol))
              << what << " partition " << partition << " max diff " << max_diff(fused, reference);
        }
      }
    }
  }
}

TEST(DecodeKernels, PartitionSizesFillTheDeviceAndFitSharedMemory) {
  // Batch 1 over a long context: partitions shrink so that rows x kv x partitions reaches 256 blocks.
  EXPECT_EQ(kernels::decode_partition_size(1, 16, 8, 128, 1024), 32);
  EXPECT_EQ(kernels::decode_partition_size(256, 16, 8, 128, 1024), 256);
  EXPECT_EQ(kernels::decode_partition_size(64, 16, 8, 128, 1024), 256);
  // A span within one partition stays one partition: smaller ones would add no blocks.
  EXPECT_EQ(kernels::decode_partition_size(1, 16, 8, 128, 20), 256);
  // 32 query heads per KV head need smaller partitions to fit 48 KiB of shared memory; 64 at 256 dims never fit.
  EXPECT_EQ(kernels::decode_partition_size(256, 32, 1, 128, 4096), 128);
  EXPECT_EQ(kernels::decode_partition_size(256, 64, 1, 256, 4096), 0);
  EXPECT_FALSE(kernels::supports(torch::kBFloat16, 64, 1, 256));
  EXPECT_TRUE(kernels::supports(torch::kBFloat16, 16, 8, 128));
  EXPECT_FALSE(kernels::supports(torch::kBFloat16, 16, 8, 512));   // head_dim past 256
  EXPECT_FALSE(kernels::supports(torch::kBFloat16, 12, 8, 128));   // heads not a multiple of KV heads
  EXPECT_FALSE(kernels::supports(torch::kFloat64, 16, 8, 128));
}

TEST(DecodeKernels, SplitPartitionsSplitOnlyWhenRowsTimesKvHeadsLeaveMultiprocessorsIdle) {
  // Qwen3-1.7B's 8 KV heads, 1008 positions in blocks of 16, on 132 multiprocessors (H100 / H200).
  EXPECT_EQ(kernels::split_partition_size(64, 8, 1008, 16, 132), 1008);  // 512 blocks: one partition
  EXPECT_EQ(kernels::split_partition_size(256, 8, 1008, 16, 132), 1008);
  EXPECT_EQ(kernels::split_partition_size(33, 8, 1000, 16, 132), 1008);  // 264 blocks, the span rounded up
  EXPECT_EQ(kernels::split_partition_size(32, 8, 1008, 16, 132), 512);   // 256 blocks: two partitions
  EXPECT_EQ(kernels::split_partition_size(16, 8, 1008, 16, 132), 336);   // 128: three
  EXPECT_EQ(kernels::split_partition_size(1, 8, 1008, 16, 132), 64);     // 8: 16 of 64 positions, not 33 of 31
  EXPECT_EQ(kernels::split_partition_size(1, 8, 40, 16, 132), 64);       // a span shorter than 64: one partition
  // Odd cache blocks: partitions stay even (whole pairs of blocks).
  EXPECT_EQ(kernels::split_partition_size(1, 2, 1000, 5, 132), 70);
  EXPECT_EQ(kernels::split_partition_size(200, 2, 999, 5, 132), 1000);
}

TEST(DecodeKernels, PagedAttentionVariantIsSwitchable) {
  const auto saved = kernels::paged_attention_variant();
  kernels::set_paged_attention_variant(kernels::PagedAttentionVariant::kV2);
  EXPECT_EQ(kernels::paged_attention_variant(), kernels::PagedAttentionVariant::kV2);
  // The CPU reference is the same for both variants.
  const auto c = paged_case({3, 9, 20}, 4, 2, 8, 4, torch::kFloat32);
  auto v2 = kernels::paged_decode_attention(c.q, c.key_pool, c.value_pool, c.tables, c.lengths, c.span, 0.5);
  kernels::set_paged_attention_variant(kernels::PagedAttentionVariant::kV1);
  EXPECT_EQ(kernels::paged_attention_variant(), kernels::PagedAttentionVariant::kV1);
  auto v1 = kernels::paged_decode_attention(c.q, c.key_pool, c.value_pool, c.tables, c.lengths, c.span, 0.5);
  EXPECT_TRUE(torch::equal(v1, v2));
  kernels::set_paged_attention_variant(saved);
}

TEST(DecodeKernels, BadInputsAreRefusedByName) {
  const auto x = torch::randn({2, 8});
  try {
    kernels::rms_norm(x, torch::ones({8}, torch::kFloat64), 1e-6);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kernels::rms_norm: every operand must be a Float"), std::string::npos)
        << e.what();
  }
  try {
    kernels::rotary(torch::randn({2, 3, 8}), torch::randn({2, 6}), torch::randn({2, 6}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kernels::rotary: expected x [rows, heads, head_dim]"), std::string::npos)
        << e.what();
  }
  const auto c = paged_case({3, 9}, 4, 2, 8, 4, torch::kFloat32);
  try {
    kernels::paged_decode_attention(c.q, c.key_pool, c.value_pool, c.tables, c.lengths, c.span + 1, 1.0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("span " + std::to_string(c.span + 1)), std::string::npos) << e.what();
  }
  auto bad_tables = c.tables.clone();
  bad_tables[1][2] = c.key_pool.size(0);
  try {
    kernels::paged_decode_attention(c.q, c.key_pool, c.value_pool, bad_tables, c.lengths, c.span, 1.0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 1 names block"), std::string::npos) << e.what();
  }
}

TEST(DecodeKernels, ModeSwitchesWhereTheModelUsesThem) {
  const auto saved = kernels::mode();
  kernels::set_mode(kernels::Mode::kOff);
  EXPECT_FALSE(kernels::active_for(torch::Device(torch::kCPU)));
  kernels::set_mode(kernels::Mode::kEverywhere);
  EXPECT_TRUE(kernels::active_for(torch::Device(torch::kCPU)));
  kernels::set_mode(kernels::Mode::kCuda);
  EXPECT_FALSE(kernels::active_for(torch::Device(torch::kCPU)));  // the CPU keeps its own fused decode
  kernels::set_mode(saved);
}

}  // namespace
}  // namespace hybridflow
