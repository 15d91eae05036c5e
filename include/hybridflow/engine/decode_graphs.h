// The paged decode step replayed as CUDA graphs (GenerationConfig::cuda_graphs; verl's
// rollout.enforce_eager: false). Each step's rows, tokens, block tables and lengths are padded to the bucket
// engine/decode_graph_plan.h picks and copied into that bucket's graph's static input buffer (one copy from
// pinned memory); the graph then replays the whole step (embedding, rotary, mask, block addressing, every
// layer, final norm: CausalLM::decode_paged_on_device) as one launch. A bucket's graph is captured the first
// time a step needs it, after a warm-up run on a side stream (which writes the same keys and values the
// replay writes again); all graphs share one memory pool. The prefill is never captured.
//
// With a sampling config (the continuous generator's) each graph also draws the next tokens: the model's head,
// the sampleable vocabulary, temperature / top-k / top-p from the step's uniforms (the chunk's draws, uploaded
// once per chunk and copied on the device into the graph's static buffer) and the log-probs, so that a decode
// step is one replay and one small copy of its uniforms; the stop checks stay with the chunk's token ring.
//
// Only in a CUDA build (HF_WITH_CUDA): elsewhere construction throws. The graphs read the weights and the
// block pools at their addresses at capture: they live for one generate() call, whose weights and pools do
// not move, or are kept for the next with their pools while those addresses hold
// (engine/decode_graph_cache.h).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "hybridflow/engine/decode_graph_plan.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/model/transformer.h"

namespace hybridflow {

// A decode step's draw, on the device: the next tokens [rows] int64, their log-probs [rows] and the rows with
// no finite sampling distribution [rows] bool (undefined when greedy).
struct DecodeDraw {
  torch::Tensor tokens, log_probs, no_mass;
};

// What a drawing graph captures, from static device buffers: decode_paged_on_device's step for tokens [rows, 1]
// int64, tables [rows, span / block_size] and lengths [rows], then the draw with `uniforms` [rows] float64
// (undefined when greedy). Reads nothing back, so it can be captured; it also runs eagerly on any device.
DecodeDraw decode_and_draw_step(CausalLM& model, const GenerationConfig& cfg, const torch::Tensor& tokens,
                                const torch::Tensor& tables, const torch::Tensor& lengths, int64_t span,
                                const RotaryFrequencies& rotary, PagedKVCache& cache, const torch::Tensor& uniforms);

class DecodeGraphs {
 public:
  // model on a CUDA device with model->decodes_on_device(); `cache`'s pools made, block `pad_block` owned by
  // no sequence (padding writes there). Throws naming enforce_eager where graphs cannot run.
  // `sampling`, when given, makes every graph draw the next tokens too (decode_and_draw; then decode() is not
  // called).
  DecodeGraphs(CausalLM& model, PagedKVCache& cache, DecodeGraphPlan::Options options, int64_t pad_block,
               int64_t pad_token, std::optional<GenerationConfig> sampling = std::nullopt);
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

  // The step and the draw of the next tokens in one replay (a sampling config given): input tokens [rows] int64
  // and uniforms [rows] float64 (undefined when greedy) on the device, copied into the graph's static buffers
  // on the device. The draw's tensors are views valid until the next step. Steps the plan runs eagerly make
  // the same draw from decode_paged's hidden states.
  // tables[r] points at row r's block table (the block manager's own: nothing is copied but into the graph's
  // input).
  DecodeDraw decode_and_draw(const torch::Tensor& tokens, const torch::Tensor& uniforms,
                             const std::vector<const std::vector<int64_t>*>& tables,
                             const std::vector<int64_t>& lengths);

  // The pools moved to another PagedKVCache object (kept between calls, taken by the next): the graphs read
  // the same tensors. Throws if `cache` holds other pools than those the graphs were made for.
  void rebind(PagedKVCache& cache);

  int64_t captured() const { return plan_.graphs(); }
  int64_t replayed_steps() const { return replayed_; }
  int64_t eager_steps() const { return eager_; }

 private:
  struct Graph;
  // A step from host tokens (one per row), or from device_tokens where defined (then `tokens` is null).
  // A drawing step where `drawn` is given: it gets the draw made with `uniforms` (undefined when greedy).
  torch::Tensor step(const int64_t* tokens, const torch::Tensor& device_tokens,
                     const std::vector<const std::vector<int64_t>*>& tables, const std::vector<int64_t>& lengths,
                     const torch::Tensor& uniforms = {}, DecodeDraw* drawn = nullptr);
  CausalLM model_;        // held: kept graphs may outlive the caller's handle
  PagedKVCache* cache_;   // the pools' current holder (rebind)
  std::vector<const void*> pools_;  // the pools' addresses the graphs read
  torch::Device device_;
  DecodeGraphPlan plan_;
  int64_t pad_block_, pad_token_;
  std::optional<GenerationConfig> sampling_;
  RotaryFrequencies rotary_;  // on the device
  std::map<DecodeGraphBucket, std::unique_ptr<Graph>> graphs_;
  int64_t replayed_ = 0, eager_ = 0;
};

}  // namespace hybridflow
