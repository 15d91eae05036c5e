// What this machine can do, measured, and what a model's work costs, counted: the two halves of a roofline.
// `hybridflow bench` divides each measured throughput by the bound that limits it, so a figure reads as "this
// fraction of what the hardware allows for this exact work", comparable across machines and load.
//   - memory bandwidth: a STREAM-style triad (a = b + s c) over arrays far larger than the caches;
//   - matmul throughput: the model's own weight shapes, each weight a distinct tensor (as in the model, so
//     weights stream from memory when they do not fit the caches), multiplied by `rows` activations.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hybridflow/model/model_config.h"

namespace hybridflow {

// One weight matrix of the model as nn::Linear holds it ([out, in]), and how many the model has.
struct MatmulShape {
  std::string name;  // "q_proj", "gate_proj", "lm_head", ...
  int64_t out_features = 0;
  int64_t in_features = 0;
  int64_t count = 0;  // one per layer, or 1 for lm_head
};

// Every matmul weight of one forward pass (the embedding lookup is no matmul; a tied lm_head still is).
std::vector<MatmulShape> model_matmul_shapes(const ModelConfig& config);
// The parameters in those matmuls: a forward pass costs 2 FLOPs per parameter per token plus attention.
int64_t matmul_parameters(const ModelConfig& config);
// Bytes a decode step must read at least once: every matmul weight, in `dtype`.
double decode_weight_bytes(const ModelConfig& config, torch::Dtype dtype);
// Forward FLOPs per token that attends over `context` keys: 2 x matmul parameters, plus scores and mixing
// (2 matmuls of context x head_dim per head per layer, 2 FLOPs each), counted as computed.
double forward_flops_per_token(const ModelConfig& config, double context);
// Forward + backward over sequences of `seq` tokens: 3x the forward (backward is two matmuls per forward one),
// i.e. 6 x parameters + attention, the usual convention; the full seq x seq score matrix is counted.
double train_flops_per_token(const ModelConfig& config, int64_t seq);

// The best (shortest) of repeated runs of `fn`, after one warm-up: at least `min_reps` runs and at least
// `min_seconds` in all. Best-of, because on a shared machine the noise only ever adds time.
double best_seconds(const std::function<void()>& fn, int min_reps, double min_seconds);

// STREAM triad a = b + 3 c on float32 arrays of `elements` each (3 x 4 x elements bytes moved per pass, the
// STREAM convention: write-allocate traffic is not counted). Returns GB/s (1e9 bytes).
double stream_triad_gb_per_s(int64_t elements, int min_reps = 5);

struct MatmulTiming {
  double seconds = 0;  // one pass over all the shapes
  double flops = 0;    // 2 x rows x out x in, summed
  double gflops() const { return flops / seconds / 1e9; }
};

// One pass of x [rows, in] through `count` distinct weights of each shape (torch::linear, as the model runs
// them), in `dtype`. The best of repeated passes.
MatmulTiming time_matmuls(const std::vector<MatmulShape>& shapes, int64_t rows, torch::Dtype dtype,
                          double min_seconds = 0.3);

}  // namespace hybridflow
