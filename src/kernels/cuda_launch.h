// The CUDA kernels' launchers on raw device pointers (decode_kernels.cu, compiled by nvcc without libtorch's
// headers, which keeps the CUDA compile small); decode_kernels.cpp checks the tensors and calls them on the
// current stream. Each returns nullptr, or the CUDA error's text when the launch failed.
#pragma once

#include <cstdint>

namespace hybridflow::kernels::cuda {

enum class Dtype { kFloat32, kFloat16, kBFloat16 };

// rows x n elements: out = weight * rms_norm(x); with `delta`, sum = x + delta first and the norm is of sum.
const char* rms_norm(Dtype dtype, const void* x, const void* delta, const void* weight, void* sum, void* out,
                     int64_t rows, int64_t n, float eps, void* stream);
const char* swiglu(Dtype dtype, const void* gate, const void* up, void* out, int64_t count, void* stream);
// x, out [rows, heads, dim]; cos, sin [rows, dim].
const char* rotary(Dtype dtype, const void* x, const void* cos, const void* sin, void* out, int64_t rows,
                   int64_t heads, int64_t dim, void* stream);

struct PagedAttention {
  const void* q;            // [rows, heads, dim]
  const void* key_pool;     // [blocks, kv_heads, block_size, dim]
  const void* value_pool;
  const int64_t* tables;    // [rows, width]
  const int64_t* lengths;   // [rows]
  void* out;                // [rows, heads, dim]
  float* partial_out;       // [rows, heads, partitions, dim]: each partition's unnormalised sum of p v
  float* partial_max;       // [rows, heads, partitions]: its largest score (-inf when it holds no position)
  float* partial_sum;       // [rows, heads, partitions]: its sum of exp(score - max)
  int64_t rows, heads, kv_heads, dim, width, block_size, span, sliding_window, partition_size, partitions;
  float scale;
};
const char* paged_decode_attention(Dtype dtype, const PagedAttention& args, void* stream);
// The same attention by the bandwidth-bound kernels (paged_attention_v2.cu): q, key_pool and value_pool aligned
// to two elements; partial_out, partial_max and partial_sum only read and written when partitions > 1.
const char* paged_decode_attention_v2(Dtype dtype, const PagedAttention& args, void* stream);

}  // namespace hybridflow::kernels::cuda
