// How many operator calls and kernels one decode step of a CUDA graph launches (decode_and_draw_step: the
// layers over a paged cache, the head and the draw), counted on the CPU (support/operator_counter.h) with the
// fused decode kernels' CPU references standing in for their CUDA kernels (kernels::Mode::kEverywhere), and
// with the kernels off (HF_DECODE_KERNELS=off: the unfused operators). A Qwen3-shaped model (q/k norms, GQA)
// in bf16; two depths give the count of one layer and of what lies outside the layers, and the test prints
// both with the step of a 28-layer model (Qwen3-1.7B's depth) built from them.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <string>
#include <vector>

#include "hybridflow/engine/decode_graphs.h"
#include "hybridflow/kernels/decode_kernels.h"
#include "hybridflow/kernels/few_rows_linear.h"
#include "hybridflow/model/rotary.h"
#include "support/operator_counter.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

struct StepCounts {
  testing::OperatorCounts per_layer, outside;
};

// One counted decode step at `layers` layers and `rows` rows (after an uncounted one: lazy initialisation).
testing::OperatorCounts count_step(int64_t layers, int64_t rows) {
  torch::manual_seed(3);
  ModelConfig config = testing::tiny_model_config(
      {.vocab_size = 97, .hidden_size = 64, .intermediate_size = 128, .num_hidden_layers = layers,
       .num_attention_heads = 4, .num_key_value_heads = 2},
      "qwen3-tiny");
  CausalLM model(config);
  model->eval();
  model->to(torch::kBFloat16);
  torch::NoGradGuard no_grad;
  const int64_t block_size = 4, width = 4, span = block_size * width, d = config.head_dim();
  PagedKVCache cache;
  for (int64_t l = 0; l < layers; ++l) {
    cache.keys.push_back(torch::randn({rows * width, config.num_key_value_heads, block_size, d}).to(torch::kBFloat16));
    cache.values.push_back(torch::randn_like(cache.keys.back()));
  }
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  const auto tokens = torch::randint(0, config.vocab_size, {rows, 1}, i64);
  const auto tables = torch::arange(rows * width, i64).view({rows, width});
  const auto lengths = torch::full({rows}, 9, i64);
  const auto uniforms = torch::rand({rows}, torch::kFloat64);
  GenerationConfig cfg;
  cfg.greedy = false;
  cfg.temperature = 0.7;
  const RotaryFrequencies rotary = rotary_frequencies(config, 0);
  decode_and_draw_step(model, cfg, tokens, tables, lengths, span, rotary, cache, uniforms);
  testing::OperatorCounter counter;
  decode_and_draw_step(model, cfg, tokens, tables, lengths, span, rotary, cache, uniforms);
  return counter.counts();
}

StepCounts count_steps(kernels::Mode mode, int64_t rows, bool few_rows_linear = false) {
  const auto saved = kernels::mode();
  const bool saved_few_rows = kernels::few_rows_linear_enabled();
  kernels::set_mode(mode);
  kernels::set_few_rows_linear_enabled(few_rows_linear);
  const auto two = count_step(2, rows), four = count_step(4, rows);
  kernels::set_mode(saved);
  kernels::set_few_rows_linear_enabled(saved_few_rows);
  StepCounts c;
  c.per_layer = {(four.operator_calls - two.operator_calls) / 2, (four.kernels - two.kernels) / 2};
  c.outside = {two.operator_calls - 2 * c.per_layer.operator_calls, two.kernels - 2 * c.per_layer.kernels};
  return c;
}

void print(const char* what, int64_t rows, const StepCounts& c) {
  std::printf("decode step, %s, batch %lld (qwen3 shape, bf16, CPU-counted): per layer %lld kernels, %lld operator "
              "calls; outside the layers %lld kernels, %lld operator calls; a 28-layer step %lld kernels, %lld "
              "operator calls\n",
              what, static_cast<long long>(rows), static_cast<long long>(c.per_layer.kernels),
              static_cast<long long>(c.per_layer.operator_calls), static_cast<long long>(c.outside.kernels),
              static_cast<long long>(c.outside.operator_calls),
              static_cast<long long>(c.outside.kernels + 28 * c.per_layer.kernels),
              static_cast<long long>(c.outside.operator_calls + 28 * c.per_layer.operator_calls));
}

TEST(DecodeStepCounts, FusedKernelsLaunchFewerKernelsThanTheOperators) {
  for (int64_t rows : {int64_t{1}, int64_t{64}}) {
    const StepCounts fused = count_steps(kernels::Mode::kEverywhere, rows);
    const StepCounts unfused = count_steps(kernels::Mode::kOff, rows);
    print("fused decode kernels", rows, fused);
    print("HF_DECODE_KERNELS=off", rows, unfused);
    // The counts cover real work: every layer projects (7 matmuls at least).
    EXPECT_GE(unfused.per_layer.kernels, 7);
    EXPECT_GE(fused.per_layer.kernels, 7);
    EXPECT_LT(fused.per_layer.kernels, unfused.per_layer.kernels);
    // A layer through the fused kernels: the input norm (fused with the residual add before it), q, k and v,
    // the q/k norm + rotary + cache write kernel, attention, o_proj, add + norm, gate, up, SwiGLU, down.
    EXPECT_LE(fused.per_layer.kernels, 12);
    EXPECT_LT(fused.per_layer.operator_calls, unfused.per_layer.operator_calls);
  }
}

// HF_DECODE_GEMV=on (kernels/few_rows_linear.h): at a few rows q, k and v are one kernel, gate, up and SwiGLU
// another, and the head writes its float32 logits itself; past kFewRowsMax rows the step is the fused one.
TEST(DecodeStepCounts, FewRowsProjectionsLaunchFourKernelsFewerALayer) {
  for (int64_t rows : {int64_t{1}, int64_t{5}, int64_t{64}}) {
    const StepCounts fused = count_steps(kernels::Mode::kEverywhere, rows);
    const StepCounts few_rows = count_steps(kernels::Mode::kEverywhere, rows, /*few_rows_linear=*/true);
    print("fused decode kernels + HF_DECODE_GEMV=on", rows, few_rows);
    if (rows <= kernels::kFewRowsMax) {
      // q, k, v: 3 -> 1; gate, up, SwiGLU: 3 -> 1. The head's matmul and float32 conversion: 2 -> 1.
      EXPECT_EQ(few_rows.per_layer.kernels, fused.per_layer.kernels - 4) << "rows " << rows;
      EXPECT_EQ(few_rows.outside.kernels, fused.outside.kernels - 1) << "rows " << rows;
      EXPECT_LE(few_rows.per_layer.kernels, 8);
    } else {
      EXPECT_EQ(few_rows.per_layer.kernels, fused.per_layer.kernels) << "rows " << rows;
      EXPECT_EQ(few_rows.outside.kernels, fused.outside.kernels) << "rows " << rows;
    }
  }
}

}  // namespace
}  // namespace hybridflow
