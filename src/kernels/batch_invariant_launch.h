// The batch-invariant CUDA kernels' launchers on raw device pointers (batch_invariant_kernels.cu, plain CUDA
// without libtorch's headers); batch_invariant_kernels.cpp checks the tensors and calls them on the current
// stream. Each returns nullptr, or the CUDA error's text when the launch failed. Everything is float32.
#pragma once

#include <cstdint>

namespace hybridflow::kernels::cuda::invariant {

// y [rows, out] = x [rows, in] * w [out, in]^T (+ bias [out]).
const char* linear(const float* x, const float* w, const float* bias, float* y, int64_t rows, int64_t in,
                   int64_t out, void* stream);

// out = weight * (x * (1 / sqrt(mean(x^2) + eps))) per row of x [rows, n].
const char* rms_norm(const float* x, const float* weight, float* out, int64_t rows, int64_t n, float eps,
                     void* stream);

// gate = silu(gate) * up, elementwise over count.
const char* swiglu(float* gate, const float* up, int64_t count, void* stream);

// Where token t's keys live: table row rows[t], key index slots[t]; position p of table row r in block
// tables[r * width + p / block_size] at offset p % block_size of the pools [blocks, kv_heads, block_size, dim].
struct TokenPlaces {
  const int64_t* rows;    // [tokens]
  const int64_t* slots;   // [tokens]
  const int64_t* tables;  // [table rows, width]
  int64_t tokens, width, block_size;
};

// Per token: each query head of q [tokens, heads * dim] and each KV head of k [tokens, kv_heads * dim] normed
// (q_norm / k_norm [dim], when not null) and rotated in place by cos, sin [tokens, dim]; the keys and the
// values v [tokens, kv_heads * dim] then written into the pools at the token's slot.
struct HeadsIntoCache {
  float* q;
  float* k;
  const float* v;
  const float* q_norm;
  const float* k_norm;
  const float* cos;
  const float* sin;
  float* key_pool;
  float* value_pool;
  TokenPlaces places;
  int64_t heads, kv_heads, dim;
  float eps;
};
const char* heads_into_cache(const HeadsIntoCache& args, void* stream);

// out [tokens, heads * dim]: token t's query head h attends, in key order, to the keys of its table row at
// indices [slots[t] - sliding_window + 1, slots[t]] (all up to slots[t] when sliding_window is 0) that
// key_mask [table rows, key_mask_stride] allows (null: all): softmax(q k * scale) v, zeros where it sees none.
struct Attention {
  const float* q;
  const float* key_pool;
  const float* value_pool;
  const int64_t* key_mask;
  float* out;
  TokenPlaces places;
  int64_t heads, kv_heads, dim, sliding_window, key_mask_stride;
  float scale;
};
const char* attention(const Attention& args, void* stream);

// Per row of logits [rows, vocab]: log softmax(z / temperature)[targets[r]] and (entropy not null) the
// entropy of softmax(z / temperature). Targets must lie in [0, vocab) (the caller checks).
const char* token_log_probs(const float* logits, const int64_t* targets, float* log_probs, float* entropy,
                            int64_t rows, int64_t vocab, float temperature, void* stream);

}  // namespace hybridflow::kernels::cuda::invariant
