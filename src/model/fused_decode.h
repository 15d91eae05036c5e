// Decode steps on the CPU in float32 without libtorch's per-operator overhead: one token per row through
// every decoder layer, each layer a handful of loops (norm, the q/k/v projections together, rotary + cache
// write + attention, o_proj, norm, gate and up together, down_proj) instead of ~50 tensor operators.
//
// At one to a few rows decoding reads every weight once per token, so it is bound by memory bandwidth:
// libtorch's matrix multiply at one row streams the weights at a quarter of what the machine reads, on one
// core, and each small operator costs about as much as its arithmetic. Up to kMaxVectorRows rows the whole
// step is one OpenMP team (this file is compiled with OpenMP): each thread reads its share of every weight
// matrix once for all rows, and the threads meet at spin barriers between the phases of a layer, not at a
// new parallel region per operator. Past kMaxVectorRows rows the projections go to libtorch's matrix
// multiply, which is faster there; norms, rotary, the cache and attention stay fused at any row count.
//
// Rows read and write their own sequence's cache (continuous batching, engine/generation.h): row r appends its
// key and value at position lengths[r] and attends to its positions [0, lengths[r]], in a slot of its own or
// in the blocks of its block table (a paged cache), so rows of different lengths share a step without
// padding and without gathering the cache. Internal to the model layer (transformer.cpp decides when it
// applies).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace hybridflow::fused_decode {

// Up to this many rows the projections run on this file's matrix-vector kernel; beyond, on at::mm.
constexpr int64_t kMaxVectorRows = 8;

struct LayerWeights {
  at::Tensor input_norm, post_norm;           // [hidden]
  at::Tensor q, k, v, o;                      // [out, in], as nn::Linear stores them
  at::Tensor q_bias, k_bias, v_bias, o_bias;  // undefined when the model has none
  at::Tensor q_norm, k_norm;                  // [head_dim], Qwen3 only
  at::Tensor gate, up, down;
};

struct Shape {
  int64_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0;
  double eps = 1e-6;
  int64_t sliding_window = 0;  // 0 = none
};

// True when h and every weight are contiguous float32 CPU tensors of the shapes nn::Linear and the norms
// give them for `shape` (the caller checks tensor parallelism). A 3D-HybridEngine generation weight
// gathered as [k, out, in / k] (transformer.cpp's row_parallel) is not one: the kernels would read it as
// [out, in] and compute something else.
bool supports(const at::Tensor& h, const Shape& shape, const std::vector<LayerWeights>& layers);

// Where the rows' positions live in the per-layer pools [blocks, kv_heads, block_size, head_dim]: position p
// of row r in block ids[r * width + p / block_size], at offset p % block_size. A slot cache is width 1,
// block_size = its capacity and the slots as ids.
struct BlockTables {
  const int64_t* ids = nullptr;
  int64_t width = 1;
  int64_t block_size = 0;
};

// h [rows, hidden] float32, updated in place through `layers`. keys/values: one pool per layer (float32
// contiguous), addressed through `tables`. cos/sin [rows, head_dim] float32: the rotary tables at each row's
// position lengths[r].
void decode_layers(at::Tensor& h, const Shape& shape, const std::vector<LayerWeights>& layers,
                   std::vector<at::Tensor>& keys, std::vector<at::Tensor>& values, const BlockTables& tables,
                   const std::vector<int64_t>& lengths, const at::Tensor& cos, const at::Tensor& sin);

// x [rows, in] times w [out, in] transposed: [rows, out] float32, for rows <= kMaxVectorRows (the logits
// of a decode step). Same contract as torch::linear without bias.
at::Tensor linear(const at::Tensor& x, const at::Tensor& w);

// The few-rows kernel's instruction-set variants; the fastest one the CPU has runs (selected_isa()). For tests
// comparing them: y[r * ldy + o] = w[o, :] . x[r, :] for o in [o0, o1) and r in [0, rows), w [out, in];
// false, computing nothing, when the CPU lacks `isa`.
enum class Isa { portable, avx2, avx512 };
Isa selected_isa();
bool rows_dot_with(Isa isa, const float* w, int64_t in, const float* x, int64_t ldx, int64_t rows, int64_t o0,
                   int64_t o1, float* y, int64_t ldy);

}  // namespace hybridflow::fused_decode
