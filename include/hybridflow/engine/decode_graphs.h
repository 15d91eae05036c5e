// The paged decode step replayed as CUDA graphs (GenerationConfig::cuda_graphs; verl's
// rollout.enforce_eager: false). Each step's rows, tokens, block tables and lengths are padded to the bucket
// engine/decode_graph_plan.h picks and copied into that bucket's graph's static input buffer (one copy from
// pinned memory); the graph then replays the whole step (embedding, rotary, mask, block addressing, every
// layer, final norm: CausalLM::decode_paged_on_device) as one launch. A bucket's graph is captured the first
// time a step needs it, after a warm-up run on a side stream (which writes the same keys and values the
// replay writes again); all graphs share one memory pool. The prefill is never captured.
//
// Only in a CUDA build (HF_WITH_CUDA): elsewhere construction throws. The graphs read the weights and the
// block pools at their addresses at capture: they live for one generate() call, whose weights and pools do
// not move.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "hybridflow/engine/decode_graph_plan.h"
#include "hybridflow/model/transformer.h"

namespace hybridflow {

class DecodeGraphs {
 public:
  // model on a CUDA device with model->decodes_on_device(); `cache`'s pools made, block `pad_block` owned by
  // no sequence (padding writes there). Throws naming enforce_eager where graphs cannot run.
  DecodeGraphs(CausalLM& model, PagedKVCache& cache, DecodeGraphPlan::Options options, int64_t pad_block,
               int64_t pad_token);
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  // decode_paged's step: [rows, 1, hidden] (a view of the graph's output, valid until the next step).
  torch::Tensor decode(const std::vector<int64_t>& tokens, const std::vector<std::vector<int64_t>>& tables,
                       const std::vector<int64_t>& lengths);
  // The same with the input tokens [rows] int64 already on the device (the step before drew them): copied
  // into the graph's input on the device, nothing read back.
  torch::Tensor decode(const torch::Tensor& tokens, const std::vector<std::vector<int64_t>>& tables,
                       const std::vector<int64_t>& lengths);

  int64_t captured() const { return plan_.graphs(); }
  int64_t replayed_steps() const { return replayed_; }
  int64_t eager_steps() const { return eager_; }

 private:
  struct Graph;
  // A step from host tokens, or from device_tokens where defined (then `tokens` holds only padding).
  torch::Tensor step(const std::vector<int64_t>& tokens, const torch::Tensor& device_tokens,
                     const std::vector<std::vector<int64_t>>& tables, const std::vector<int64_t>& lengths);
  CausalLM& model_;
  PagedKVCache& cache_;
  torch::Device device_;
  DecodeGraphPlan plan_;
  int64_t pad_block_, pad_token_;
  RotaryFrequencies rotary_;  // on the device
  std::map<DecodeGraphBucket, std::unique_ptr<Graph>> graphs_;
  int64_t replayed_ = 0, eager_ = 0;
};

}  // namespace hybridflow
