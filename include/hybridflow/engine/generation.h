// Batched autoregressive generation for rollouts: left-padded prompts of different lengths, a KV
// cache, temperature / top-k / top-p / greedy sampling, per-sequence eos stopping, n samples per prompt,
// reproducible from a seed without touching the global RNG.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "hybridflow/model/transformer.h"
#include "hybridflow/parallel/collectives.h"

namespace hybridflow {

struct GenerationConfig {
  int64_t max_new_tokens = 32;
  double temperature = 1.0;
  int64_t top_k = 0;      // 0 = no top-k filter
  double top_p = 1.0;     // 1 = no nucleus filter
  bool greedy = false;
  int64_t n = 1;          // samples per prompt
  uint64_t seed = 0;
  // A sequence ends at any of these (Llama 3 instruct stops on several); empty = never stop early.
  std::vector<int64_t> eos_token_ids;
  int64_t pad_token_id = 0;
  // Ids at or past this are never drawn (0 = the whole vocabulary): a model's embedding may be padded past
  // its tokenizer (Qwen pads 151,669 tokens to 151,936), and those rows decode to nothing.
  int64_t sampleable_vocab_size = 0;
  bool use_kv_cache = true;   // false recomputes the whole sequence each step (benchmark baseline)
};

struct GenerationOutput {
  torch::Tensor prompts;        // [B*n, P] int64, left-padded with pad_token_id (row i*n+j = sample j of prompt i)
  torch::Tensor prompt_mask;    // [B*n, P] int64 (1 real, 0 pad)
  torch::Tensor responses;      // [B*n, R] int64, R = longest response; after eos (inclusive eos kept) padded with pad
  torch::Tensor response_mask;  // [B*n, R] int64, 1 for generated tokens up to and including eos
  torch::Tensor log_probs;      // [B*n, R] float32, log-prob of each sampled token under softmax(logits / temperature)
                                // (greedy: temperature 1), 0 where masked
};

// Runs under NoGradGuard in eval mode and restores the model's train/eval mode afterwards. Output tensors
// live on the model's device. Throws hybridflow::Error on an empty prompt or invalid sampling settings.
//
// A pipeline stage generates together with the other stages of its model (`stages`: one rank per stage, in
// stage order; every stage calls with the same prompts and config). Each step's hidden states pass from
// stage to stage, the last stage samples, and its tokens and log-probs are broadcast, so every stage
// returns the whole output. One micro-batch: a stage waits while the others compute.
GenerationOutput generate(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                          const GenerationConfig& cfg, Communicator* stages = nullptr);

// Next-token choice from last-position logits [rows, vocab] (float32): returns the tokens [rows] and their
// log-probs under softmax(logits / temperature) (greedy: temperature 1). top-k / top-p only restrict
// which tokens may be drawn.
std::pair<torch::Tensor, torch::Tensor> sample_next_tokens(const torch::Tensor& logits, const GenerationConfig& cfg,
                                                           at::Generator& generator);

}  // namespace hybridflow
