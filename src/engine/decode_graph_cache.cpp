#include "hybridflow/engine/decode_graph_cache.h"

#include <bit>

#include "hybridflow/core/error.h"

namespace hybridflow {

std::vector<int64_t> decode_graph_fingerprint(CausalLM& model, const GenerationConfig& cfg) {
  std::vector<int64_t> f;
  const auto address = [](const void* p) { return static_cast<int64_t>(reinterpret_cast<std::uintptr_t>(p)); };
  f.push_back(address(model.ptr().get()));
  for (const auto& list : {model->parameters(), model->buffers()})
    for (const auto& t : list) {
      f.push_back(t.defined() ? address(t.data_ptr()) : 0);
      f.push_back(t.defined() ? t.numel() : -1);
      f.push_back(t.defined() ? static_cast<int64_t>(t.scalar_type()) : -1);
    }
  const torch::Device device = model->parameters().front().device();
  f.push_back(static_cast<int64_t>(device.type()));
  f.push_back(device.index());
  f.push_back(cfg.kv_block_size);
  // Whether graphs were made: what decides it in continuous batching besides the device.
  f.push_back(cfg.cuda_graphs ? 1 : 0);
  f.push_back(cfg.refresh_weights || cfg.record_routing ? 1 : 0);
  f.push_back(model->decodes_on_device() ? 1 : 0);
  f.push_back(cfg.greedy ? 1 : 0);
  f.push_back(std::bit_cast<int64_t>(cfg.temperature));
  f.push_back(cfg.top_k);
  f.push_back(std::bit_cast<int64_t>(cfg.top_p));
  f.push_back(cfg.sampleable_vocab_size);
  f.push_back(cfg.pad_token_id);
  return f;
}

std::optional<KeptDecodeGraphs> DecodeGraphCache::take(const std::vector<int64_t>& fingerprint, int64_t pool_blocks,
                                                       int64_t max_span, int64_t max_rows) {
  std::optional<KeptDecodeGraphs> kept = std::move(kept_);
  kept_.reset();
  if (!kept || kept->fingerprint != fingerprint || kept->pool_blocks < pool_blocks || kept->max_span < max_span ||
      kept->max_rows < max_rows)
    return std::nullopt;  // dropped here, before the call allocates its own
  return kept;
}

void DecodeGraphCache::keep(KeptDecodeGraphs kept) {
  HF_CHECK(!kept.pools.keys.empty(), "decode graph cache: no pools to keep");
  kept_.reset();
  kept_ = std::move(kept);
  if (kept_->graphs) kept_->graphs->rebind(kept_->pools);
}

}  // namespace hybridflow
