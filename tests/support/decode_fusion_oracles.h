// What kernels::qk_norm_rotary_cache_write (hybridflow/kernels/decode_fusions.h) must compute, written as the
// calls it replaces: decode_kernels.h's rms_norm and rotary and the cache writes through index_copy_ (the fused
// decode step before it), and the model's unfused operators. Shared by the CPU reference tests (tests/kernels)
// and the GPU parity checks (tests/engine/test_cuda_parity.cpp).
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "hybridflow/kernels/decode_kernels.h"
#include "support/decode_kernel_oracles.h"

namespace hybridflow::testing {

// One decode step's attention inputs over a pool of shuffled blocks: q [rows, heads, dim], k and v [rows, kv,
// dim], Qwen3's norms (undefined without), cos and sin at each row's position, and pools filled with random
// values (so a write to the wrong place shows).
struct QkCacheCase {
  torch::Tensor q, k, v, q_norm, k_norm, cos, sin, key_pool, value_pool, tables, lengths;
  QkCacheCase to(const torch::Device& device) const {
    auto on = [&](const torch::Tensor& t) { return t.defined() ? t.to(device) : t; };
    return {on(q),   on(k),        on(v),          on(q_norm), on(k_norm), on(cos),
            on(sin), on(key_pool), on(value_pool), on(tables), on(lengths)};
  }
  QkCacheCase clone() const {
    QkCacheCase c = *this;
    c.key_pool = key_pool.clone();
    c.value_pool = value_pool.clone();
    return c;
  }
};

inline QkCacheCase qk_cache_case(const std::vector<int64_t>& lengths, int64_t heads, int64_t kv, int64_t dim,
                                 int64_t block_size, bool norms, torch::Dtype dtype) {
  QkCacheCase c;
  const int64_t rows = static_cast<int64_t>(lengths.size());
  int64_t width = 0;
  for (int64_t l : lengths) width = std::max(width, l / block_size + 1);
  const int64_t blocks = rows * width + 2;
  c.q = (3 * torch::randn({rows, heads, dim})).to(dtype);
  c.k = (3 * torch::randn({rows, kv, dim})).to(dtype);
  c.v = torch::randn({rows, kv, dim}).to(dtype);
  if (norms) {
    c.q_norm = (1 + 0.1 * torch::randn({dim})).to(dtype);
    c.k_norm = (1 + 0.1 * torch::randn({dim})).to(dtype);
  }
  const auto angles = torch::rand({rows, dim}) * 100;
  c.cos = angles.cos().to(dtype);
  c.sin = angles.sin().to(dtype);
  c.key_pool = torch::randn({blocks, kv, block_size, dim}).to(dtype);
  c.value_pool = torch::randn({blocks, kv, block_size, dim}).to(dtype);
  c.tables = torch::randperm(blocks, torch::kInt64).narrow(0, 0, rows * width).view({rows, width}).contiguous();
  c.lengths = torch::tensor(lengths, torch::kInt64);
  return c;
}

// Rows of a pool viewed as [-1, dim] where each row's key and value go: (block * kv + h) * block_size + offset.
inline torch::Tensor qk_cache_write_index(const QkCacheCase& c) {
  const int64_t kv = c.k.size(1), block_size = c.key_pool.size(2);
  auto block = c.tables.gather(1, c.lengths.div(block_size, "floor").unsqueeze(1));
  auto heads = torch::arange(kv, c.lengths.options()).unsqueeze(0);
  return ((block * kv + heads) * block_size + c.lengths.remainder(block_size).unsqueeze(1)).reshape(-1);
}

// The cache writes of the step before the fusion: k (as rotated) and c.v through index_copy_ into c's pools.
inline void write_key_and_value(QkCacheCase& c, const torch::Tensor& k) {
  const int64_t dim = c.q.size(2);
  const auto index = qk_cache_write_index(c);
  c.key_pool.view({-1, dim}).index_copy_(0, index, k.reshape({-1, dim}));
  c.value_pool.view({-1, dim}).index_copy_(0, index, c.v.reshape({-1, dim}));
}

// The fused decode step before the fusion: decode_kernels.h's norms and rotary, then index_copy_ into c's pools.
inline torch::Tensor separate_qk_kernels_and_cache_writes(QkCacheCase& c, double eps) {
  auto q = c.q, k = c.k;
  if (c.q_norm.defined()) {
    q = kernels::rms_norm(q, c.q_norm, eps);
    k = kernels::rms_norm(k, c.k_norm, eps);
  }
  q = kernels::rotary(q, c.cos, c.sin);
  k = kernels::rotary(k, c.cos, c.sin);
  write_key_and_value(c, k);
  return q;
}

// The model's unfused operators: RMSNorm in fp32 (unfused_rms_norm) and rotate_half, into c's pools.
inline torch::Tensor unfused_qk_operators_and_cache_writes(QkCacheCase& c, double eps) {
  auto q = c.q, k = c.k;
  if (c.q_norm.defined()) {
    q = unfused_rms_norm(q, c.q_norm, eps);
    k = unfused_rms_norm(k, c.k_norm, eps);
  }
  const auto cos = c.cos.unsqueeze(1), sin = c.sin.unsqueeze(1);
  q = q * cos + rotate_half(q) * sin;
  k = k * cos + rotate_half(k) * sin;
  write_key_and_value(c, k);
  return q;
}

inline torch::Tensor fused_qk_norm_rotary_cache_write(QkCacheCase& c, double eps) {
  return kernels::qk_norm_rotary_cache_write(c.q, c.k, c.v, c.q_norm, c.k_norm, eps, c.cos, c.sin, c.key_pool,
                                             c.value_pool, c.tables, c.lengths);
}

// rotary_cos_sin's operators (model/rotary.h) for positions [rows]: cos and sin [rows, 2 * inv_freq.size(0)].
inline std::pair<torch::Tensor, torch::Tensor> unfused_rotary_tables(const torch::Tensor& positions,
                                                                     const torch::Tensor& inv_freq, double scaling,
                                                                     torch::Dtype dtype) {
  auto freqs = positions.to(torch::kFloat32).unsqueeze(-1) * inv_freq.to(positions.device());
  auto emb = torch::cat({freqs, freqs}, -1);
  auto cos = emb.cos(), sin = emb.sin();
  if (scaling != 1.0) {
    cos = cos * scaling;
    sin = sin * scaling;
  }
  return {cos.to(dtype), sin.to(dtype)};
}

// Qwen3's frequencies (rope_theta 1e6) over head_dim: 1 / theta^(2i / head_dim).
inline torch::Tensor qwen3_inv_freq(int64_t head_dim) {
  return 1.0 / torch::pow(1e6, torch::arange(0, head_dim, 2, torch::kFloat64) / static_cast<double>(head_dim))
                   .to(torch::kFloat32);
}

}  // namespace hybridflow::testing
