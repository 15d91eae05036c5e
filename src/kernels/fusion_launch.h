// The launchers of decode_fusions.cu on raw device pointers (plain CUDA without libtorch's headers, as
// cuda_launch.h's); decode_fusions.cpp checks the tensors and calls them on the current stream. Each returns
// nullptr, or the CUDA error's text when the launch failed.
#pragma once

#include <cstdint>

#include "kernels/cuda_launch.h"

namespace hybridflow::kernels::cuda {

struct QkRotaryCacheWrite {
  const void* q;            // [rows, heads, dim]
  const void* k;            // [rows, kv_heads, dim]
  const void* v;            // [rows, kv_heads, dim]
  const void* q_norm;       // [dim], or nullptr (then k_norm is too): no norm
  const void* k_norm;
  const void* cos;          // [rows, dim]
  const void* sin;
  void* q_out;              // [rows, heads, dim]
  void* key_pool;           // [blocks, kv_heads, block_size, dim]
  void* value_pool;
  const int64_t* tables;    // [rows, width]
  const int64_t* lengths;   // [rows]
  int64_t rows, heads, kv_heads, dim, width, block_size;
  float eps;
};
const char* qk_norm_rotary_cache_write(Dtype dtype, const QkRotaryCacheWrite& args, void* stream);

// cos, sin [rows, dim] of positions [rows] and inv_freq [dim / 2]; scaled: times `scaling`.
const char* rotary_tables(Dtype dtype, const int64_t* positions, const float* inv_freq, float scaling, bool scaled,
                          void* cos, void* sin, int64_t rows, int64_t dim, void* stream);

}  // namespace hybridflow::kernels::cuda
