// What the two generation paths (generation_static.cpp, continuous_batching.cpp) share: the prompts as
// the output's left-padded tensors, token choice with per-sequence draws, and the hand-off between
// pipeline stages. Internal to the engine layer; the interface is engine/generation.h.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "hybridflow/engine/generation.h"

namespace hybridflow::generation {

// The output's prompt tensors: row q = i * n + j holds prompt i left-padded to the longest prompt.
struct PromptBatch {
  torch::Tensor ids;    // [B*n, P] int64 on the model's device, pad_token_id on the left
  torch::Tensor mask;   // [B*n, P] int64 (1 real, 0 pad)
  int64_t longest = 0;  // P
};
PromptBatch pad_prompts(const std::vector<std::vector<int64_t>>& prompts, const GenerationConfig& cfg,
                        torch::Device device);

// A pipeline stage's part of one forward: a stage after the first receives its input from the stage
// before, one before the last sends its output on, and the last stage's choice of tokens reaches every
// stage. Without stages every call is a no-op (the model is whole).
class StageLink {
 public:
  StageLink(CausalLM& model, Communicator* stages);
  bool samples() const { return !stage_->enabled() || stage_->last(); }
  // Before a forward of input_ids [rows, seq].
  void receive(int64_t rows, int64_t seq);
  // After it, with what this stage computed.
  void send(const torch::Tensor& hidden);
  // The last stage's tokens [rows] int64 and log-probs [rows] float32, on every stage.
  void share(torch::Tensor& tokens, torch::Tensor& log_probs, int64_t rows);

 private:
  CausalLM& model_;
  Communicator* stages_;
  const PipelineStage* stage_;
};

// Tokens and log-probs for last-position hidden states [rows, hidden]: row r is token steps[r] of sequence
// sequences[r], drawn with sampling_uniform(cfg.seed, sequences[r], steps[r]).
std::pair<torch::Tensor, torch::Tensor> choose_tokens(CausalLM& model, const torch::Tensor& hidden,
                                                      const GenerationConfig& cfg,
                                                      const std::vector<int64_t>& sequences,
                                                      const std::vector<int64_t>& steps);

// The paged pool's size in blocks that cfg fixes: kv_cache_blocks when > 0, else what memory_budget_bytes
// buys (gpu_memory_utilization of it less the weights); 0 when neither is set.
int64_t given_pool_blocks(CausalLM& model, const GenerationConfig& cfg);

// A slab of zeros [sizes] (on the CPU from fresh anonymous pages, zeroed by the kernel when first touched).
torch::Tensor zero_slab(const std::vector<int64_t>& sizes, const torch::TensorOptions& options);

// True when a token id ends a sequence.
bool is_eos(const GenerationConfig& cfg, int64_t token);

GenerationOutput generate_static(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                 const GenerationConfig& cfg, Communicator* stages);
GenerationOutput generate_continuous(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                     const GenerationConfig& cfg, Communicator* stages);

}  // namespace hybridflow::generation
