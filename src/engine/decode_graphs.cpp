#include "hybridflow/engine/decode_graphs.h"

#include <algorithm>

#include "engine/generation_steps.h"
#include "hybridflow/core/error.h"

#ifdef HF_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace hybridflow {

#ifdef HF_WITH_CUDA
struct DecodeGraphs::Graph {
  at::cuda::CUDAGraph graph;
  torch::Tensor inputs;                  // [rows x (2 + width)] int64: tokens, lengths, tables
  torch::Tensor tokens, lengths, tables;  // views of inputs
  torch::Tensor output;                  // [rows, 1, hidden], written by each replay (not drawing)
  torch::Tensor uniforms;                // [rows] float64: the step's draws (drawing, sampled)
  DecodeDraw draw;                       // written by each replay (drawing)
  bool captured = false;                 // capture_end returned: graph.pool() is valid
  // The first `rows` rows of the buffers above, kept while consecutive steps have as many rows (most of a
  // chunk's): five views fewer to make per step.
  int64_t view_rows = -1;
  torch::Tensor tokens_in, uniforms_in, output_out;
  DecodeDraw draw_out;

  void view_rows_of(int64_t rows) {
    if (rows == view_rows) return;
    view_rows = rows;
    tokens_in = tokens.narrow(0, 0, rows);
    uniforms_in = uniforms.narrow(0, 0, rows);
    if (output.defined()) output_out = output.narrow(0, 0, rows);
    draw_out = {};
    if (draw.tokens.defined())
      draw_out = {draw.tokens.narrow(0, 0, rows), draw.log_probs.narrow(0, 0, rows),
                  draw.no_mass.defined() ? draw.no_mass.narrow(0, 0, rows) : torch::Tensor()};
  }
};

#else
struct DecodeGraphs::Graph {};
#endif

namespace {

std::vector<const void*> pool_addresses(const PagedKVCache& cache) {
  std::vector<const void*> addresses;
  for (const auto& k : cache.keys) addresses.push_back(k.data_ptr());
  for (const auto& v : cache.values) addresses.push_back(v.data_ptr());
  return addresses;
}

// What the draw reads of a generation config (engine/generation.cpp's draw_tokens and choose_tokens_on_device):
// graphs kept past their call must not hold the call's callbacks and pointers.
std::optional<GenerationConfig> draw_settings(const std::optional<GenerationConfig>& cfg) {
  if (!cfg) return std::nullopt;
  GenerationConfig d;
  d.greedy = cfg->greedy;
  d.temperature = cfg->temperature;
  d.top_k = cfg->top_k;
  d.top_p = cfg->top_p;
  d.sampleable_vocab_size = cfg->sampleable_vocab_size;
  d.pad_token_id = cfg->pad_token_id;
  return d;
}

}  // namespace

DecodeGraphs::DecodeGraphs(CausalLM& model, PagedKVCache& cache, DecodeGraphPlan::Options options, int64_t pad_block,
                           int64_t pad_token, std::optional<GenerationConfig> sampling)
    : model_(model),
      cache_(&cache),
      pools_(pool_addresses(cache)),
      device_(model->parameters().front().device()),
      plan_(options),
      pad_block_(pad_block),
      pad_token_(pad_token),
      sampling_(draw_settings(sampling)) {
#ifndef HF_WITH_CUDA
  HF_FAIL("actor_rollout_ref.rollout.enforce_eager: false replays the decode step as CUDA graphs, which this CPU ",
          "build of hybridflow lacks (rebuild with HF_CUDA=1), or set it true");
#else
  HF_CHECK(device_.is_cuda(), "actor_rollout_ref.rollout.enforce_eager: false replays the decode step as CUDA graphs; ",
           "the model is on ", device_, " (set it true there)");
  HF_CHECK(model->decodes_on_device(), "actor_rollout_ref.rollout.enforce_eager: false: CUDA graphs decode one rank's ",
           "whole dense model without unmerged LoRA adapters, dynamic RoPE scaling, batch-invariant kernels or ",
           "router recording; set it true for this model");
  HF_CHECK(!cache.keys.empty() && pad_block >= 0 && pad_block < cache.keys.front().size(0),
           "decode graphs: the pad block ", pad_block, " is not in the paged pool");
  rotary_ = rotary_frequencies(model->config(), 0);
  rotary_.inv_freq = rotary_.inv_freq.to(device_);
#endif
}

DecodeGraphs::~DecodeGraphs() = default;

void DecodeGraphs::rebind(PagedKVCache& cache) {
  HF_CHECK(pool_addresses(cache) == pools_, "decode graphs: rebound to other KV pools than they were captured on");
  cache_ = &cache;
}

DecodeDraw decode_and_draw_step(CausalLM& model, const GenerationConfig& cfg, const torch::Tensor& tokens,
                                const torch::Tensor& tables, const torch::Tensor& lengths, int64_t span,
                                const RotaryFrequencies& rotary, PagedKVCache& cache, const torch::Tensor& uniforms) {
  const torch::Tensor hidden = model->decode_paged_on_device(tokens, tables, lengths, span, rotary, cache);
  return generation::choose_tokens_on_device(model, hidden.select(1, 0), cfg, uniforms);
}

namespace {

std::vector<const std::vector<int64_t>*> graph_table_refs(const std::vector<std::vector<int64_t>>& tables) {
  std::vector<const std::vector<int64_t>*> refs;
  refs.reserve(tables.size());
  for (const auto& table : tables) refs.push_back(&table);
  return refs;
}

}  // namespace

DecodeDraw DecodeGraphs::decode_and_draw(const torch::Tensor& tokens, const torch::Tensor& uniforms,
                                         const std::vector<const std::vector<int64_t>*>& tables,
                                         const std::vector<int64_t>& lengths) {
  HF_CHECK(sampling_.has_value(), "decode graphs: decode_and_draw needs the graphs made with a sampling config");
  DecodeDraw drawn;
  step(nullptr, tokens, tables, lengths, sampling_->greedy ? torch::Tensor() : uniforms, &drawn);
  return drawn;
}

torch::Tensor DecodeGraphs::decode(const std::vector<int64_t>& tokens, const std::vector<std::vector<int64_t>>& tables,
                                   const std::vector<int64_t>& lengths) {
  HF_CHECK(!sampling_, "decode graphs: graphs made with a sampling config draw their tokens (decode_and_draw)");
  HF_CHECK(tokens.size() == tables.size(), "decode graphs: ", tokens.size(), " tokens for ", tables.size(), " tables");
  return step(tokens.data(), torch::Tensor(), graph_table_refs(tables), lengths);
}

torch::Tensor DecodeGraphs::decode(const torch::Tensor& tokens, const std::vector<std::vector<int64_t>>& tables,
                                   const std::vector<int64_t>& lengths) {
  HF_CHECK(!sampling_, "decode graphs: graphs made with a sampling config draw their tokens (decode_and_draw)");
  HF_CHECK(tokens.size(0) == static_cast<int64_t>(tables.size()), "decode graphs: ", tokens.size(0), " tokens for ",
           tables.size(), " tables");
  return step(nullptr, tokens, graph_table_refs(tables), lengths);
}

torch::Tensor DecodeGraphs::step(const int64_t* tokens, const torch::Tensor& device_tokens,
                                 const std::vector<const std::vector<int64_t>*>& tables,
                                 const std::vector<int64_t>& lengths, const torch::Tensor& uniforms,
                                 DecodeDraw* drawn) {
  const auto rows = static_cast<int64_t>(tables.size());
  int64_t longest = 1;
  for (int64_t length : lengths) longest = std::max(longest, length + 1);
  const DecodeGraphPlan::Decision decision = plan_.decide(rows, longest);
  if (decision.action == DecodeGraphPlan::Action::kEager) {
    ++eager_;
    auto ids = device_tokens.defined()
                   ? device_tokens.view({rows, 1})
                   : torch::tensor(std::vector<int64_t>(tokens, tokens + rows), torch::TensorOptions().dtype(torch::kInt64))
                         .view({rows, 1})
                         .to(device_);
    std::vector<std::vector<int64_t>> copies;
    copies.reserve(tables.size());
    for (const auto* table : tables) copies.push_back(*table);
    torch::Tensor hidden = model_->decode_paged(ids, copies, lengths, *cache_);
    if (drawn != nullptr) *drawn = generation::choose_tokens_on_device(model_, hidden.select(1, 0), *sampling_, uniforms);
    return hidden;
  }
#ifndef HF_WITH_CUDA
  HF_FAIL("decode graphs: not in this CPU build");
#else
  const DecodeGraphBucket bucket = decision.bucket;
  const int64_t n = bucket.rows, width = bucket.span / plan_.options().block_size;
  // Written straight into pinned memory, which the caching host allocator hands out again only once the
  // copies queued from it have run: the steps queued ahead of the device each keep their own.
  auto host = torch::empty({n * (2 + width)}, torch::TensorOptions().dtype(torch::kInt64).pinned_memory(true));
  plan_.write_padded(bucket, tokens, tables, lengths, pad_block_, pad_token_, host.data_ptr<int64_t>());
  auto& slot = graphs_[bucket];
  if (decision.action == DecodeGraphPlan::Action::kCapture) {
    slot = std::make_unique<Graph>();
    Graph& g = *slot;
    g.inputs = torch::empty({n * (2 + width)}, torch::TensorOptions().dtype(torch::kInt64).device(device_));
    g.tokens = g.inputs.narrow(0, 0, n).view({n, 1});
    g.lengths = g.inputs.narrow(0, n, n);
    g.tables = g.inputs.narrow(0, 2 * n, n * width).view({n, width});
    g.inputs.copy_(host, /*non_blocking=*/true);
    if (device_tokens.defined()) g.tokens.narrow(0, 0, rows).copy_(device_tokens.view({rows, 1}));
    g.uniforms = torch::zeros({n}, torch::TensorOptions().dtype(torch::kFloat64).device(device_));
    if (uniforms.defined()) g.uniforms.narrow(0, 0, rows).copy_(uniforms);
    auto run = [&] {
      if (!sampling_) return model_->decode_paged_on_device(g.tokens, g.tables, g.lengths, bucket.span, rotary_, *cache_);
      g.draw = decode_and_draw_step(model_, *sampling_, g.tokens, g.tables, g.lengths, bucket.span, rotary_, *cache_,
                                    sampling_->greedy ? torch::Tensor() : g.uniforms);
      return torch::Tensor();
    };
    c10::cuda::getCurrentCUDAStream().synchronize();
    {
      c10::cuda::CUDAStreamGuard side(c10::cuda::getStreamFromPool());
      run();  // warm-up: lazy initialisation outside the capture; writes the keys and values the replay writes
      c10::cuda::getCurrentCUDAStream().synchronize();
      // One pool for this set's graphs (a step replays one graph at a time on one stream, so their
      // activations may share memory), taken from a graph that holds it: a pool id kept after its last graph
      // is gone trips the caching allocator's assertion (use_count > 0) on the next capture.
      c10::MempoolId_t pool{0, 0};
      for (const auto& [other_bucket, other] : graphs_)
        if (other && other.get() != &g && other->captured) {
          pool = other->graph.pool();
          break;
        }
      g.graph.capture_begin(pool);
      g.output = run();
      g.graph.capture_end();
      g.captured = true;
      c10::cuda::getCurrentCUDAStream().synchronize();
    }
    plan_.mark_captured(bucket);
  } else {
    slot->view_rows_of(rows);
    slot->inputs.copy_(host, /*non_blocking=*/true);
    if (device_tokens.defined()) slot->tokens_in.copy_(device_tokens.view({rows, 1}));
    if (uniforms.defined()) slot->uniforms_in.copy_(uniforms);
  }
  slot->graph.replay();
  ++replayed_;
  slot->view_rows_of(rows);
  if (drawn != nullptr) {
    *drawn = slot->draw_out;
    return torch::Tensor();
  }
  return slot->output_out;
#endif
}

}  // namespace hybridflow
