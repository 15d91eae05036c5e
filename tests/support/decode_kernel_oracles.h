// What the fused decode kernels (hybridflow/kernels/decode_kernels.h) must compute, written with the model's
// unfused operators: RMSNorm, rotate_half, and attention of one query per row over K/V gathered out of a paged
// cache through scaled_dot_product_attention. Shared by the CPU reference tests (tests/kernels) and the GPU
// parity checks (tests/engine/test_cuda_parity.cpp).
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace hybridflow::testing {

inline torch::Tensor unfused_rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  auto h = x.to(torch::kFloat32);
  h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * h.to(x.scalar_type());
}

inline torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

// A pool of shuffled blocks holding each row's keys and values at positions [0, lengths[r]] (random values past
// them too, which nothing may read), and the unfused step's view of them: K/V gathered to [rows, kv, span, d].
struct PagedCase {
  torch::Tensor q, key_pool, value_pool, tables, lengths, keys, values;
  int64_t span = 0;
  PagedCase to(const torch::Device& device) const {
    return {q.to(device),      key_pool.to(device), value_pool.to(device), tables.to(device),
            lengths.to(device), keys.to(device),    values.to(device),     span};
  }
};

inline PagedCase paged_case(const std::vector<int64_t>& lengths, int64_t heads, int64_t kv, int64_t dim,
                            int64_t block_size, torch::Dtype dtype) {
  PagedCase c;
  const int64_t rows = static_cast<int64_t>(lengths.size());
  int64_t width = 0;
  for (int64_t l : lengths) width = std::max(width, l / block_size + 1);
  const int64_t blocks = rows * width + 3;
  c.key_pool = torch::randn({blocks, kv, block_size, dim}).to(dtype);
  c.value_pool = torch::randn({blocks, kv, block_size, dim}).to(dtype);
  c.q = torch::randn({rows, heads, dim}).to(dtype);
  c.tables = torch::randperm(blocks, torch::kInt64).narrow(0, 0, rows * width).view({rows, width}).contiguous();
  c.lengths = torch::tensor(lengths, torch::kInt64);
  c.span = width * block_size;
  auto positions = torch::arange(c.span, torch::kInt64);
  auto block = c.tables.index_select(1, positions.div(block_size, "floor"));  // [rows, span]
  auto offset = positions.remainder(block_size).unsqueeze(0).expand_as(block);
  // pool [blocks, kv, bs, d] -> [blocks, bs, kv, d] -> [rows, span, kv, d] -> [rows, kv, span, d]
  auto gather = [&](const torch::Tensor& pool) {
    return pool.permute({0, 2, 1, 3}).index({block, offset}).permute({0, 2, 1, 3}).contiguous();
  };
  c.keys = gather(c.key_pool);
  c.values = gather(c.value_pool);
  return c;
}

// The unfused step: each query head against its KV head's gathered keys, masked past the row's length and
// outside the window, through scaled_dot_product_attention in fp32 on the case's device.
inline torch::Tensor unfused_paged_attention(const PagedCase& c, double scale, int64_t window) {
  const int64_t rows = c.q.size(0), heads = c.q.size(1), kv = c.keys.size(1);
  auto keys = c.keys.to(torch::kFloat32).repeat_interleave(heads / kv, 1);
  auto values = c.values.to(torch::kFloat32).repeat_interleave(heads / kv, 1);
  auto pos = torch::arange(c.span, c.lengths.options()).unsqueeze(0);
  auto len = c.lengths.unsqueeze(1);
  auto visible = pos.le(len);
  if (window > 0) visible = visible & pos.gt(len - window);
  auto mask = visible.view({rows, 1, 1, c.span});
  auto q = c.q.to(torch::kFloat32).unsqueeze(2);
  return at::scaled_dot_product_attention(q, keys, values, mask, 0.0, false, scale).squeeze(2);
}

}  // namespace hybridflow::testing
