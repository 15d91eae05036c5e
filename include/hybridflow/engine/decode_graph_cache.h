// Decode graphs kept from one generate() call to the next (GenerationConfig::decode_graph_cache). A rollout
// worker that keeps its KV cache between rollouts (verl's rollout.free_cache_engine: false) keeps the CUDA
// graphs captured on it too, so that its first rollout captures them and the later ones only replay: each
// capture costs a warm-up step, the capture and the instantiation with the device drained before each, and a
// rollout passes through several buckets (engine/decode_graph_plan.h).
//
// Graphs read the weights and the block pools at the addresses they had at capture. A call therefore takes
// the kept set only when its fingerprint is the same (the same model object, every weight where it was - the
// actor's weights are updated in place, a rollout copy made again is elsewhere -, the same draw settings and
// block size) and the set holds what the call needs (pool blocks, the longest sequence, the rows); else the
// set is dropped, its memory going back before the call makes its own pools.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "hybridflow/engine/decode_graphs.h"

namespace hybridflow {

// What kept decode graphs depend on besides their pools: the model object, each parameter's and buffer's
// address, element count and dtype, the device, the block size, whether graphs are made and replay the model
// (cuda_graphs, no partial rollout or router recording, CausalLM::decodes_on_device: unmerged LoRA adapters,
// for one, change what a step computes) and the draw settings.
std::vector<int64_t> decode_graph_fingerprint(CausalLM& model, const GenerationConfig& cfg);

// One call's pools and the graphs captured on them (none where graphs do not apply: the pools alone are kept).
struct KeptDecodeGraphs {
  std::vector<int64_t> fingerprint;
  PagedKVCache pools;  // with graphs, the pad block included (the last)
  std::unique_ptr<DecodeGraphs> graphs;
  int64_t pool_blocks = 0;  // blocks sequences may hold (the pools' first dimension less the pad block)
  int64_t max_span = 0;     // the graphs' plan's
  int64_t max_rows = 0;
};

class DecodeGraphCache {
 public:
  // The kept set if it was made with `fingerprint` and holds at least `pool_blocks` blocks, `max_span`
  // positions and `max_rows` rows; otherwise the set (if any) is dropped and nothing is returned. The set
  // leaves the cache either way: the call holds it until it keeps it again.
  std::optional<KeptDecodeGraphs> take(const std::vector<int64_t>& fingerprint, int64_t pool_blocks, int64_t max_span,
                                       int64_t max_rows);
  // Keeps `kept` for the next call (its graphs rebound to the kept pools), dropping what was kept before.
  void keep(KeptDecodeGraphs kept);
  // Drops the kept set: its pools' and graphs' memory goes back to the allocator.
  void clear() { kept_.reset(); }
  bool holds() const { return kept_.has_value(); }
  // The kept set's graphs (0 when nothing is kept).
  int64_t graphs() const { return kept_ && kept_->graphs ? kept_->graphs->captured() : 0; }

 private:
  std::optional<KeptDecodeGraphs> kept_;
};

}  // namespace hybridflow
