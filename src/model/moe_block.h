// The sparse MLP of a mixture-of-experts decoder layer (model/moe.h), registered under transformers'
// checkpoint names: "gate" (the router), "experts.<e>.{gate,up,down}_proj" (Mixtral: w1, w3, w2) and, for
// Qwen2-MoE, "shared_expert" and "shared_expert_gate".
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "hybridflow/model/model_config.h"
#include "hybridflow/model/moe.h"
#include "hybridflow/parallel/expert_parallel.h"
#include "hybridflow/parallel/tensor_parallel.h"

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

  // Expert parallelism: keeps experts [rank E / n, (rank + 1) E / n) of the E (still registered as
  // "experts.<e>", their checkpoint names) and drops the others. Once, before an optimizer sees the parameters.
  // `same_tokens`: the tensor-parallel ranks inside the group (Megatron's experts folded over them), which hold
  // the same tokens: each sends its 1/t of the rows into the exchange and the outputs are gathered after.
  void shard_experts(const ExpertParallelGroup& ep, const TensorParallelGroup& same_tokens = {});
  // Under expert parallelism: every expert in this process (all-gathered over the group, without gradients), so
  // that forwards need no lockstep with the group (generation); release_gathered_experts drops the others' again.
  // Collective. The gathered projections are one tensor each, [experts, out, in]; this rank's own experts are
  // re-pointed at their slices of it (their old memory freed, the optimizer's tensors the same), so no expert
  // is held twice, and get memory of their own back, bit for bit, on release. Adds what it moved to `moved`.
  void gather_experts(ExpertGather& moved);
  void release_gathered_experts();
  // While gathered: each expert's three weights under `prefix` + ".experts.<e>.<projection>.weight", into `out`.
  void add_gathered_expert_weights(const std::string& prefix, std::map<std::string, torch::Tensor>& out) const;

  torch::nn::Linear gate{nullptr};  // the router: [experts, hidden], no bias
  std::vector<Expert> experts;      // by global index; under expert parallelism null where another rank owns it
  Expert shared_expert{nullptr};                  // qwen2_moe only
  torch::nn::Linear shared_expert_gate{nullptr};  // qwen2_moe only: [1, hidden]

 private:
  int64_t top_k_;
  bool normalise_;
  bool float_weights_;  // Mixtral scales expert outputs by float32 weights; the Qwen types cast them first
  int64_t hidden_, width_;
  const char *gate_name_, *up_name_, *down_name_;
  std::shared_ptr<torch::nn::Module> holder_;  // "experts"
  ExpertParallelGroup ep_;
  TensorParallelGroup same_tokens_;
  int64_t first_local_ = 0;  // this rank's experts: [first_local_, first_local_ + local_count_)
  int64_t local_count_ = 0;
  bool gathered_ = false;
  std::vector<torch::Tensor> gathered_projections_;  // while gathered: gate, up, down as [experts, out, in]
};
TORCH_MODULE(SparseBlock);

// Each expert's output for the tokens routed to it, scaled by their weights and summed per token: the tokens
// are sorted by expert and each expert runs on its contiguous group (a loop, or on CUDA where model/cuda_fused.h
// allows, expert_groups_grouped_gemm). x [tokens, hidden].
torch::Tensor run_experts(const torch::Tensor& x, const TopKRouting& routing, std::vector<Expert>& experts,
                          bool float_weights);
// The same for experts [first, first + count) only (the others' slots add nothing): a rank's part of the output
// when its group's ranks hold the same tokens and their own experts.
torch::Tensor run_expert_range(const torch::Tensor& x, const TopKRouting& routing, std::vector<Expert>& experts,
                               int64_t first, int64_t count, bool float_weights);
// The SwiGLU of experts [first, first + sizes.size()) over `rows` sorted by expert (sizes[i] rows for expert
// first + i, in order), as three grouped GEMMs (at::_grouped_mm) over the experts' weights stacked
// [experts, in, out]: what run_experts and run_experts_parallel run on CUDA where model/cuda_fused.h allows.
// libtorch also has it on the CPU (a reference loop), where tests compare it with the experts' own forwards.
torch::Tensor expert_groups_grouped_gemm(const torch::Tensor& rows, std::vector<Expert>& experts, int64_t first,
                                         const std::vector<int64_t>& sizes);
// The same under expert parallelism: experts holds this rank's local_count experts (global indices
// [first_local, first_local + local_count)); every (token, slot) pair is sent to its expert's owner, run there and
// sent back. Collective over ep: every rank of the group calls it once per layer, in the same order.
torch::Tensor run_experts_parallel(const torch::Tensor& x, const TopKRouting& routing, std::vector<Expert>& experts,
                                   int64_t first_local, int64_t local_count, const ExpertParallelGroup& ep,
                                   bool float_weights);

}  // namespace hybridflow::moe
