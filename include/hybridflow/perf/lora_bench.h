// The memory and step time of training LoRA adapters against full fine-tuning, for `hybridflow bench lora`:
// the same model shape, batch and optimizer (libtorch's AdamW over the trainable parameters) in one process,
// so the ratios compare like with like.
#pragma once

#include <cstdint>

#include "hybridflow/model/model_config.h"

namespace hybridflow {

struct LoraStepMeasurement {
  int64_t lora_rank = 0;       // 0: full fine-tuning
  int64_t parameters = 0;      // every parameter, adapters included
  int64_t trainable = 0;       // the ones the optimizer steps
  int64_t weight_bytes = 0;    // every parameter's bytes (the frozen base and the adapters)
  int64_t grad_bytes = 0;      // gradients held after backward: the trainable parameters' only
  int64_t optimizer_bytes = 0; // AdamW's state (exp_avg, exp_avg_sq) after a step
  int64_t step_peak_bytes = 0; // the CPU allocator's peak during a step above what was held before it
  double seconds = 0;          // one step (forward, backward, AdamW), the fastest of `steps` after a warm-up
};

// Builds a model of `config` (random weights, seed 0, fp32 on the CPU), with all-linear LoRA adapters of
// `lora_rank` and `lora_alpha` when lora_rank > 0 (the base frozen), and trains it on [batch, seq] random tokens
// with a next-token loss and AdamW over the parameters that require gradients.
LoraStepMeasurement measure_lora_step(const ModelConfig& config, int64_t lora_rank, double lora_alpha, int64_t batch,
                                      int64_t seq, int64_t steps);

}  // namespace hybridflow
