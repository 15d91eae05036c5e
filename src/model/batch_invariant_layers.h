// The decoder layers in batch-invariant mode (model/batch_invariant.h), for transformer.cpp: one routine for
// whole-sequence forwards, cached prefills and decode steps, so the three compute every token alike.
// Internal to the model layer.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "hybridflow/model/model_config.h"
#include "model/fused_decode.h"

namespace hybridflow::batch_invariant {

// The tokens of one call, each a query: token n belongs to table row row[n] (its sequence in `tables`),
// writes its key and value at key index slot[n] of that sequence and sees the keys at indices
// [slot[n] - window + 1, slot[n]] (all earlier ones without a sliding window) that key_mask allows
// (key_mask[row * key_mask_stride + j] != 0; null: all). position[n] is its rotary position.
struct Tokens {
  std::vector<int64_t> row, slot, position;
  const int64_t* key_mask = nullptr;
  int64_t key_mask_stride = 0;
};

// Throws naming rollout.batch_invariant unless h and the weights are contiguous float32 CPU tensors of the
// shapes nn::Linear gives (fused_decode::supports) and `what` (the caller's description) is otherwise fine.
void check_supported(const at::Tensor& h, const fused_decode::Shape& shape,
                     const std::vector<fused_decode::LayerWeights>& layers);

// h [tokens, hidden] float32, updated in place through `layers`; keys/values one pool per layer
// [blocks, kv_heads, block_size, head_dim] (contiguous float32), addressed through `tables`.
void forward_layers(at::Tensor& h, const ModelConfig& config, const fused_decode::Shape& shape,
                    const std::vector<fused_decode::LayerWeights>& layers, std::vector<at::Tensor>& keys,
                    std::vector<at::Tensor>& values, const fused_decode::BlockTables& tables, const Tokens& tokens);

// weight * x / rms(x) per row of x [rows, n] float32 (the final norm).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace hybridflow::batch_invariant
