// Fused kernels of a decode step that replace several of decode_kernels.h's calls and libtorch operators at
// once (fewer kernels per layer; on CUDA each launch costs more than its arithmetic at small batches).
//
// As in decode_kernels.h, each function runs its CUDA kernel on CUDA tensors and its CPU reference on CPU
// tensors; the reference computes the same arithmetic in plain loops (kernels/element_math.h), rounding to the
// storage dtype wherever the unfused calls store an intermediate tensor, so both equal the calls they replace
// up to the order of a reduction. Operands are fp32, fp16 or bf16, all of one dtype.
#pragma once

#include <torch/torch.h>

namespace hybridflow::kernels {

// A decode step's attention inputs in one pass, where the unfused step runs the q and k RMSNorms, the rotary
// embedding of q and of k, and the key and value cache writes (index_copy_) one after the other:
//   q [rows, heads, head_dim], k and v [rows, kv_heads, head_dim] as projected (contiguous);
//   q_norm, k_norm [head_dim]: Qwen3's per-head norms (rms_norm(x, weight, eps) first), or both undefined;
//   cos, sin [rows, head_dim]: each row's rotary tables at its position;
//   key_pool, value_pool [blocks, kv_heads, block_size, head_dim] (contiguous), tables [rows, width] and
//   lengths [rows] (int64 on q's device): row r's new key and value go to position lengths[r], block
//   tables[r][lengths[r] / block_size] at offset lengths[r] % block_size, as paged_decode_attention reads them.
// Writes the normed, rotated keys and the values into the pools; returns the normed, rotated queries
// [rows, heads, head_dim]. Each element equals rotary(rms_norm(x)) of decode_kernels.h bit for bit.
torch::Tensor qk_norm_rotary_cache_write(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                         const torch::Tensor& q_norm, const torch::Tensor& k_norm, double eps,
                                         const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& key_pool,
                                         torch::Tensor& value_pool, const torch::Tensor& tables,
                                         const torch::Tensor& lengths);

// A decode step's rotary tables in one kernel, where rotary_cos_sin (model/rotary.h) runs seven operators:
// cos and sin [rows, head_dim] in `dtype` for positions [rows] (int64) and inv_freq [head_dim / 2] (float32).
// Element i of row r is cos(float(positions[r]) * inv_freq[i % (head_dim / 2)]) in fp32, times attention_scaling
// when it is not 1, rounded to dtype: rotary_cos_sin's arithmetic, up to the cosine's and sine's last fp32 bit
// (libm's on the CPU, CUDA's cosf and sinf on the GPU).
struct RotaryTables {
  torch::Tensor cos, sin;
};
RotaryTables rotary_tables(const torch::Tensor& positions, const torch::Tensor& inv_freq, double attention_scaling,
                           torch::ScalarType dtype);

}  // namespace hybridflow::kernels
