// The sparse MLP of a mixture-of-experts decoder layer (model/moe.h), registered under transformers'
// checkpoint names: "gate" (the router), "experts.<e>.{gate,up,down}_proj" (Mixtral: w1, w3, w2) and, for
// Qwen2-MoE, "shared_expert" and "shared_expert_gate".
#pragma once

#include <torch/torch.h>

#include <vector>

#include "hybridflow/model/model_config.h"
#include "hybridflow/model/moe.h"

namespace hybridflow::moe {

// What one forward of one MoE layer reads and writes besides its activations; each pointer may be null.
struct LayerIO {
  const torch::Tensor* replay = nullptr;  // [tokens, k]: route to these experts instead of the router's top k
  torch::Tensor* experts = nullptr;       // out: the experts used, [tokens, k]
  torch::Tensor* router_logits = nullptr; // out: [tokens, experts], with its graph (load-balancing loss)
  torch::Tensor* differs = nullptr;       // out (replay): [tokens] bool, the router's own top k is another set
};

// SwiGLU with an expert's (or the shared expert's) three projections.
class ExpertImpl : public torch::nn::Module {
 public:
  ExpertImpl(int64_t hidden, int64_t width, const char* gate_name, const char* up_name, const char* down_name);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear gate{nullptr}, up{nullptr}, down{nullptr};
};
TORCH_MODULE(Expert);

class SparseBlockImpl : public torch::nn::Module {
 public:
  explicit SparseBlockImpl(const ModelConfig& c);
  // x [..., hidden] -> [..., hidden].
  torch::Tensor forward(const torch::Tensor& x, const LayerIO& io = {});

  torch::nn::Linear gate{nullptr};  // the router: [experts, hidden], no bias
  std::vector<Expert> experts;
  Expert shared_expert{nullptr};                  // qwen2_moe only
  torch::nn::Linear shared_expert_gate{nullptr};  // qwen2_moe only: [1, hidden]

 private:
  int64_t top_k_;
  bool normalise_;
  bool float_weights_;  // Mixtral scales expert outputs by float32 weights; the Qwen types cast them first
};
TORCH_MODULE(SparseBlock);

// Each expert's output for the tokens routed to it, scaled by their weights and summed per token: the tokens
// are sorted by expert and each expert runs on its contiguous group (a loop here; the groups are laid out as
// a grouped GEMM takes them). x [tokens, hidden].
torch::Tensor run_experts(const torch::Tensor& x, const TopKRouting& routing, std::vector<Expert>& experts,
                          bool float_weights);

}  // namespace hybridflow::moe
