// The paged decode tests' generation case, shared by the GPU parity tests (tests/engine/test_cuda_parity.cpp)
// and the CPU test of the fused kernels' references (tests/engine/test_generation.cpp): a small Qwen2-layout
// model, prompts of several lengths, greedy, two samples each, fewer slots than sequences (rows join and
// leave) and blocks of 4 positions (spans cross several blocks).
#pragma once

#include <cstdint>
#include <vector>

#include "hybridflow/engine/generation.h"
#include "support/tiny_model.h"

namespace hybridflow::testing {

inline ModelConfig paged_case_model_config() {
  return tiny_model_config({.vocab_size = 97, .hidden_size = 64, .intermediate_size = 128}, "qwen2-tiny");
}

inline std::vector<std::vector<int64_t>> paged_prompts() {
  return {{5, 9, 2, 30, 7}, {1, 12}, {40, 3, 3}, {8, 8, 1, 2, 3, 4, 5, 6, 7}};
}

inline GenerationConfig paged_greedy_config() {
  GenerationConfig cfg;
  cfg.greedy = true;
  cfg.max_new_tokens = 40;
  cfg.n = 2;
  cfg.max_num_seqs = 6;
  cfg.kv_block_size = 4;
  return cfg;
}

}  // namespace hybridflow::testing
