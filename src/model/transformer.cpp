// Llama / Mistral / Qwen2 / Qwen3 decoder written to reproduce Hugging Face transformers' computation:
// RMSNorm in float32, rotate_half rotary embeddings (model/rotary.h), grouped-query attention through scaled_dot_product_attention (softmax
// accumulated in float32 by its kernels, as transformers' default "sdpa" attention), SwiGLU MLP, logits
// and values returned in float32 whatever the parameters' dtype.
#include "hybridflow/model/transformer.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <string_view>
#include <tuple>
#include <utility>

#include "hybridflow/core/device_upload.h"
#include "hybridflow/core/error.h"
#include "hybridflow/kernels/decode_fusions.h"
#include "hybridflow/kernels/decode_kernels.h"
#include "hybridflow/kernels/few_rows_linear.h"
#include "hybridflow/model/activation_checkpoint.h"
#include "hybridflow/model/batch_invariant.h"
#include "hybridflow/model/cuda_fused.h"
#include "hybridflow/model/lora.h"
#include "hybridflow/model/model_size.h"
#include "hybridflow/model/rms_norm.h"
#include "hybridflow/model/rotary.h"
#include "hybridflow/model/tensor_parallel_layout.h"
#include "hybridflow/parallel/sequence_parallel_heads.h"
#include "model/batch_invariant_layers.h"
#include "model/fused_decode.h"
#include "model/lora_branch.h"
#include "model/moe_block.h"
#include "model/rotary_rows.h"

namespace hybridflow {
namespace {

// Large but finite in every activation dtype (fp16's lowest is -65504), so a query row with no visible
// key (a padding row) gets a uniform softmax, not NaN.
double masked_score(torch::ScalarType dtype) { return dtype == torch::kHalf ? -65504.0 : -1e9; }

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps) : eps_(eps) { weight = register_parameter("weight", torch::ones({dim})); }
  torch::Tensor forward(const torch::Tensor& x) { return rms_norm(x, weight, eps_); }
  // Qwen3's per-head q/k norms see only this rank's heads: the weight enters through copy_to, whose
  // backward sums the tensor-parallel ranks' partial gradients.
  torch::Tensor forward_on_shard(const torch::Tensor& x, const TensorParallelGroup& tp) {
    return rms_norm(x, copy_to_tensor_parallel(weight, tp), eps_);
  }
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

// A row-parallel projection: this rank's slice of the input features times its columns of the weight,
// summed over the group, then the (replicated) bias. A generation-layout weight may be [k, out, in / k]:
// k training shards side by side, as the 3D-HybridEngine gathers them, used without a copy.
// A LoRA branch on the projection joins it: split with the weight, its partial product is summed by the same
// all-reduce (model/lora_branch.h); in one process it is added after the bias, in PEFT's order.
torch::Tensor row_parallel(const torch::Tensor& x, const torch::nn::Linear& proj, const TensorParallelGroup& tp,
                           const std::shared_ptr<lora::Branch>& branch = nullptr) {
  const auto& w = proj->weight;
  const bool branch_in_reduce = lora::joins_row_parallel_reduce(branch);
  HF_CHECK(!branch_in_reduce || w.dim() == 2, "LoRA: unmerged adapters on a generation-layout weight of shape ",
           w.sizes(), "; merge them into the weights first");
  torch::Tensor partial;
  if (w.dim() == 3) {
    auto chunks = x.reshape({-1, w.size(0), w.size(2)}).transpose(0, 1);  // [k, rows, in / k]
    partial = torch::bmm(chunks, w.transpose(1, 2)).sum(0);           // [rows, out]
    auto sizes = x.sizes().vec();
    sizes.back() = w.size(1);
    partial = partial.view(sizes);
  } else {
    partial = torch::linear(x, w);
  }
  if (branch_in_reduce) partial = partial + lora::row_parallel_partial(*branch, x);
  auto out = reduce_from_tensor_parallel(partial, tp);
  out = proj->bias.defined() ? out + proj->bias : out;
  return branch_in_reduce ? out : lora::add_branch(out, branch, x);
}

// Continuous batching's cache access in one decode step (CausalLMImpl::decode_slots / decode_paged): row r
// writes its key and value at position lengths[r] of its slot or block and attends to positions [0, span) of
// its sequence (its mask hides whatever lies past its own length).
}  // namespace

// Declared in the header (the decode step's layers take it); outside the anonymous namespace for that reason.
struct SlotAccess {
  torch::Tensor write_index;  // [rows * kv_heads]: rows of the slab or pool viewed as [-1, head_dim]
  torch::Tensor slots;        // slot cache: [rows]; undefined when row r is slot r (a view then, no gather)
  torch::Tensor gather;       // paged cache: [rows * kv_heads * span] rows of the pool viewed as [-1, head_dim]
  int64_t rows = 0, span = 0;
  // The fused decode kernels (hybridflow/kernels/decode_kernels.h) read the blocks in place through these
  // instead of `gather`: tables [rows, width] (a slot cache: the slots, width 1, block_size = capacity) and
  // lengths [rows], on the device.
  bool kernels = false;
  torch::Tensor tables, lengths;
  int64_t block_size = 0, sliding_window = 0;
};

namespace {

torch::Tensor slot_rows(const torch::Tensor& slab, const SlotAccess& access) {
  if (access.gather.defined()) {
    const int64_t kv = slab.size(1), d = slab.size(3);
    return slab.view({-1, d}).index_select(0, access.gather).view({access.rows, kv, access.span, d});
  }
  auto filled = slab.narrow(2, 0, access.span);
  return access.slots.defined() ? filled.index_select(0, access.slots) : filled.narrow(0, 0, access.rows);
}

// Key j of row r is visible when j <= lengths[r] (and inside Mistral's window, `sliding_window` > 0): the
// decode step's additive mask [rows, 1, 1, span] in `dtype`.
torch::Tensor decode_step_mask_bias(const torch::Tensor& lengths, int64_t span, int64_t sliding_window,
                                    torch::ScalarType dtype) {
  const int64_t b = lengths.size(0);
  auto key_pos = torch::arange(span, lengths.options()).unsqueeze(0);
  auto query_pos = lengths.unsqueeze(1);
  auto visible = key_pos.le(query_pos);
  if (sliding_window > 0) visible = visible & key_pos.gt(query_pos - sliding_window);
  return torch::zeros({b, 1, 1, span}, torch::TensorOptions().dtype(dtype).device(lengths.device()))
      .masked_fill(visible.logical_not().view({b, 1, 1, span}), masked_score(dtype));
}

// Row r's position p of KV head h is row (block * kv + h) * block_size + p % block_size of a pool viewed as
// [-1, head_dim], block = tables[r][p / block_size] (tables [rows, width], lengths [rows], int64 on the
// device): the positions each row writes ([rows * kv], at lengths[r]) and, on a paged cache, reads ([rows * kv
// * span], positions [0, span)), computed by tensor operators on the tables' device. A slot cache (width 1,
// block_size = capacity) reads its slots, tables[:, 0].
// With `kernels`, the fused kernels write and read the blocks themselves: no indices.
SlotAccess decode_step_access(const torch::Tensor& tables, const torch::Tensor& lengths, int64_t block_size,
                              int64_t span, int64_t kv, bool paged, bool kernels = false) {
  const int64_t b = tables.size(0);
  SlotAccess access;
  access.rows = b;
  access.span = span;
  access.kernels = kernels;
  access.tables = tables;
  access.lengths = lengths;
  access.block_size = block_size;
  if (!paged) access.slots = tables.select(1, 0);
  // The fused kernels write each row's key and value through the tables themselves: no indices.
  if (kernels) return access;
  auto heads = torch::arange(kv, lengths.options());
  auto block = tables.gather(1, lengths.div(block_size, "floor").view({b, 1}));  // [b, 1]
  access.write_index =
      ((block * kv + heads.view({1, kv})) * block_size + lengths.remainder(block_size).view({b, 1})).reshape(-1);
  if (!paged) return access;
  // block * kv * block_size + p % block_size over [rows, span] first, the heads added in the one pass over
  // [rows, kv, span]: a third of the time of four passes there on the CPU (2 M indices at 256 rows, 8 KV heads).
  auto positions = torch::arange(span, lengths.options());
  auto base = tables.index_select(1, positions.div(block_size, "floor"))
                  .mul_(kv * block_size)
                  .add_(positions.remainder(block_size));
  access.gather = (base.unsqueeze(1) + heads.mul(block_size).view({1, kv, 1})).reshape(-1);
  return access;
}

// Packed rows (padding-free): the maximal runs of equal attention-mask values along a row of one, each a
// sequence (or a stretch of padding) that attends only within itself.
struct SequenceRun {
  int64_t start = 0, length = 0;
};
using SequenceRuns = std::vector<SequenceRun>;

SequenceRuns sequence_runs(const torch::Tensor& mask_row) {
  const torch::Tensor values = mask_row.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t* v = values.data_ptr<int64_t>();
  SequenceRuns runs;
  for (int64_t j = 0; j < values.numel(); ++j) {
    if (j == 0 || v[j] != v[j - 1]) runs.push_back({j, 0});
    runs.back().length += 1;
  }
  return runs;
}

// Positions that restart at 0 with each sequence of a packed mask (0 on padding).
torch::Tensor packed_position_ids(const torch::Tensor& mask) {
  const int64_t t = mask.size(1);
  auto index = torch::arange(t, mask.options()).expand_as(mask);
  auto before = torch::constant_pad_nd(mask, {1, 0}, -1).narrow(1, 0, t);
  auto starts = std::get<0>(torch::where(mask.ne(before), index, torch::zeros_like(index)).cummax(1));
  return (index - starts).masked_fill(mask.eq(0), 0);
}

// How a forward without a cache attends:
//  kCausal: no row has padding (the positions a sequence-parallel group appends are cut from the output):
//           SDPA's causal attention over the whole rows, no mask.
//  kRuns:   one packed row: causal attention run by run (its padding runs attend among themselves).
//  kMask:   the additive [B, 1, T, S] mask (padded rows, several packed rows, a sliding window, a cache). Padded
//           positions keep exactly the outputs they had, which callers compare whole (padding included).
enum class CausalLayout { kCausal, kRuns, kMask };

CausalLayout causal_layout(const torch::Tensor& mask, bool packed, bool unpadded) {
  if (packed) return mask.size(0) == 1 ? CausalLayout::kRuns : CausalLayout::kMask;
  return unpadded ? CausalLayout::kCausal : CausalLayout::kMask;
}

torch::nn::Linear linear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const ModelConfig& c, const TensorParallelGroup& tp)
      : tp_(tp),
        heads_(even_partition(c.num_attention_heads, tp.size(), tp.rank(), "num_attention_heads").length),
        head_dim_(c.head_dim()),
        replicated_kv_(kv_heads_replicated(c, tp.size())),
        eps_(c.rms_norm_eps) {
    const int64_t h = c.hidden_size;
    if (replicated_kv_) {
      // Every rank computes all KV heads and keeps the one its (consecutive) query heads share.
      kv_heads_ = 1;
      all_kv_heads_ = c.num_key_value_heads;
      kv_index_ = tp.rank() / (tp.size() / c.num_key_value_heads);
    } else {
      kv_heads_ = even_partition(c.num_key_value_heads, tp.size(), tp.rank(), "num_key_value_heads").length;
      all_kv_heads_ = kv_heads_;
    }
    q_proj = register_module("q_proj", linear(h, heads_ * head_dim_, c.attention_bias));
    k_proj = register_module("k_proj", linear(h, all_kv_heads_ * head_dim_, c.attention_bias));
    v_proj = register_module("v_proj", linear(h, all_kv_heads_ * head_dim_, c.attention_bias));
    // Llama's attention_bias covers o_proj too; Qwen2 biases q/k/v only (as transformers builds them).
    o_proj = register_module("o_proj", linear(heads_ * head_dim_, h, c.o_proj_bias()));
    if (c.qk_norm()) {
      q_norm = register_module("q_norm", RMSNorm(head_dim_, c.rms_norm_eps));
      k_norm = register_module("k_norm", RMSNorm(head_dim_, c.rms_norm_eps));
    }
  }

  // x [B, T, H] (replicated); cos/sin [B, 1, T, d]; mask_bias [B, 1, T, S] in x's dtype (0 or masked_score), or
  // undefined for causal attention without a cache (see causal_layout); `runs`: attention within each run.
  // With cached_k/v: slabs holding `past` positions (see KVCache), this step's written after them, or with
  // `slots` each row's at its own slot and position.
  // Under sequence parallelism x is this rank's slice [B, T / n, H] of the sequence while cos, sin and
  // mask_bias cover the whole of it: q, k and v trade the sequence split for a head split before the rotary
  // embedding (so it sees global positions) and the attention output trades back.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& mask_bias, torch::Tensor* cached_k, torch::Tensor* cached_v,
                        int64_t past = 0, int64_t capacity = 0, const SlotAccess* slots = nullptr,
                        const SequenceParallelGroup& sp = {}, const SequenceRuns* runs = nullptr) {
    if (slots != nullptr && slots->kernels) return decode_with_kernels(x, cos, sin, *cached_k, *cached_v, *slots);
    const int64_t b = x.size(0), t = x.size(1);
    auto x_tp = copy_to_tensor_parallel(x, tp_);
    auto q = lora::project(q_proj, q_lora, x, x_tp).view({b, t, heads_, head_dim_});
    torch::Tensor k, v;
    if (replicated_kv_) {
      // The gradient of the shared heads is the sum of every rank's part: copy_to after the projection.
      // Their adapters are whole too, computed as in one process.
      k = copy_to_tensor_parallel(lora::project(k_proj, k_lora, x, x), tp_)
              .view({b, t, all_kv_heads_, head_dim_})
              .narrow(2, kv_index_, 1);
      v = copy_to_tensor_parallel(lora::project(v_proj, v_lora, x, x), tp_)
              .view({b, t, all_kv_heads_, head_dim_})
              .narrow(2, kv_index_, 1);
    } else {
      k = lora::project(k_proj, k_lora, x, x_tp).view({b, t, kv_heads_, head_dim_});
      v = lora::project(v_proj, v_lora, x, x_tp).view({b, t, kv_heads_, head_dim_});
    }
    if (q_norm) {
      q = q_norm->forward_on_shard(q, tp_);  // over head_dim: the layout of q does not matter
      k = k_norm->forward_on_shard(k, tp_);
    }
    // One rotary kernel each way on a GPU (model/rotary_rows.h, bit for bit the operators), on the tokens'
    // layout before the head split; under sequence parallelism the operators after it (cos and sin cover the
    // whole sequence there).
    const bool fused_rotary = !sp.enabled() && rotary_rows_apply(q, cos, sin) && rotary_rows_apply(k, cos, sin);
    if (fused_rotary) {
      q = rotary_rows(q, cos, sin);
      k = rotary_rows(k, cos, sin);
    }
    if (sp.enabled() && k.size(2) % sp.size() != 0) {
      // Fewer KV heads than ranks in the group (grouped-query attention split further by tensor parallelism:
      // Qwen2.5-3B's 2 KV heads at tp 2 leave one a rank): each is repeated so that every rank of the group
      // receives the KV head its share of the query heads reads. The copies' gradients sum in the backward.
      const int64_t copies = sp.size() / k.size(2);
      k = k.repeat_interleave(copies, 2);
      v = v.repeat_interleave(copies, 2);
    }
    q = sequence_to_head_split(q, sp).transpose(1, 2);
    k = sequence_to_head_split(k, sp).transpose(1, 2);
    v = sequence_to_head_split(v, sp).transpose(1, 2);
    if (!fused_rotary) {
      q = q * cos + rotate_half(q) * sin;
      k = k * cos + rotate_half(k) * sin;
    }
    if (slots != nullptr) {
      cached_k->view({-1, head_dim_}).index_copy_(0, slots->write_index, k.reshape({-1, head_dim_}));
      cached_v->view({-1, head_dim_}).index_copy_(0, slots->write_index, v.reshape({-1, head_dim_}));
      k = slot_rows(*cached_k, *slots);
      v = slot_rows(*cached_v, *slots);
    } else if (cached_k != nullptr) {
      k = append_to_slab(*cached_k, k, past, capacity);
      v = append_to_slab(*cached_v, v, past, capacity);
    }
    auto attended = runs != nullptr ? attend_runs(q, k, v, *runs) : attend(q, k, v, mask_bias);
    auto heads = head_to_sequence_split(attended.transpose(1, 2), sp).reshape({b, t, heads_ * head_dim_});
    return row_parallel(heads, o_proj, tp_, o_lora);
  }

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  std::shared_ptr<lora::Branch> q_lora, k_lora, v_lora, o_lora;  // LoRA adapters, when added
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // Qwen3 only

 private:
  // Grouped-query attention through scaled_dot_product_attention without copying K/V for every query
  // head: the `group` query heads that share a KV head are folded into the query-length axis
  // ([B, kv, group*T, d] against [B, kv, S, d]), and only the mask is repeated per group. SDPA's own
  // enable_gqa repeats K/V on the CPU, which made single-token decoding 2-5x slower (measured).
  // The head counts are q's and k's (a sequence-parallel rank attends with a share of this rank's heads).
  // An undefined mask_bias means plain causal attention over q's own positions (no cache: T == S): SDPA's
  // is_causal, which needs no [T, S] mask and lets the flash kernels skip the blocks above the diagonal. Folding
  // the query group into the length axis would shift that diagonal, so grouped heads go through enable_gqa
  // (K/V repeated per group: O(S) memory, negligible against the O(T S) mask it saves).
  torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const torch::Tensor& mask_bias) const {
    const int64_t heads = q.size(1), kv_heads = k.size(1);
    const int64_t group = heads / kv_heads;
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));
    if (!mask_bias.defined()) return at::scaled_dot_product_attention(q, k, v, {}, 0.0, true, scale, group > 1);
    if (group == 1) return at::scaled_dot_product_attention(q, k, v, mask_bias, 0.0, false, scale);
    const int64_t b = q.size(0), t = q.size(2), s = k.size(2);
    auto folded_q = q.reshape({b, kv_heads, group * t, head_dim_});
    auto folded_mask = mask_bias.unsqueeze(2).expand({b, 1, group, t, s}).reshape({b, 1, group * t, s});
    // reshape, not view: CUDA's attention kernels return [B, T, H, d]-major outputs, whose folded axis
    // does not split in place.
    return at::scaled_dot_product_attention(folded_q, k, v, folded_mask, 0.0, false, scale)
        .reshape({b, heads, t, head_dim_});
  }
  // A packed row: each run attends causally within itself, so the cost is the sum of the runs' squared lengths
  // rather than the square of their sum (a dense block-diagonal mask pays the latter). A padding run attends
  // among padding, which no real position reads. On CUDA (model/cuda_fused.h) one variable-length flash
  // attention call covers every run; elsewhere a loop over the runs.
  torch::Tensor attend_runs(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const SequenceRuns& runs) const {
    if (varlen_flash_attention_applies(q)) {
      std::vector<int64_t> starts;
      int64_t longest = 0;
      for (const SequenceRun& r : runs) {
        starts.push_back(r.start);
        longest = std::max(longest, r.length);
      }
      return varlen_flash_attention(q, k, v, starts, longest, 1.0 / std::sqrt(static_cast<double>(head_dim_)));
    }
    std::vector<torch::Tensor> parts;
    parts.reserve(runs.size());
    for (const SequenceRun& r : runs)
      parts.push_back(attend(q.narrow(2, r.start, r.length), k.narrow(2, r.start, r.length),
                             v.narrow(2, r.start, r.length), torch::Tensor()));
    return torch::cat(parts, 2);
  }
  // Writes x [B, kv, t, d] at positions [past, past + t) of the slab, making or growing it when it lacks
  // room, and returns the filled part [B, kv, past + t, d] as a view (no copy of the past).
  static torch::Tensor append_to_slab(torch::Tensor& slab, const torch::Tensor& x, int64_t past, int64_t capacity) {
    const int64_t total = past + x.size(2);
    if (!slab.defined() || slab.size(2) < total) {
      const int64_t room = std::max({capacity, total, slab.defined() ? 2 * slab.size(2) : int64_t{0}});
      auto grown = torch::empty({x.size(0), x.size(1), room, x.size(3)}, x.options());
      if (past > 0) grown.narrow(2, 0, past).copy_(slab.narrow(2, 0, past));
      slab = grown;
    }
    slab.narrow(2, past, x.size(2)).copy_(x);
    return slab.narrow(2, 0, total);
  }
  // The no-grad decode step through the fused kernels (one rank, no adapters' branches) from x [rows, 1, H]: the
  // q, k and v projections (at a few rows one kernel, kernels/few_rows_linear.h); the q/k norms, the rotary
  // embedding and the key and value cache writes as one kernel (kernels/decode_fusions.h); the attention over the
  // cache read in place through the access's tables; the output projection.
  torch::Tensor decode_with_kernels(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                    torch::Tensor& cached_k, torch::Tensor& cached_v, const SlotAccess& access) {
    const int64_t b = x.size(0);
    const auto rows = x.reshape({b, x.size(-1)});
    torch::Tensor q, k, v;
    if (kernels::few_rows_linear_applies(rows, {q_proj->weight, k_proj->weight, v_proj->weight})) {
      auto projected = kernels::few_rows_linear(rows, {q_proj->weight, k_proj->weight, v_proj->weight},
                                                {q_proj->bias, k_proj->bias, v_proj->bias});
      q = projected[0], k = projected[1], v = projected[2];
    } else {
      q = lora::project(q_proj, q_lora, x, x), k = lora::project(k_proj, k_lora, x, x);
      v = lora::project(v_proj, v_lora, x, x);
    }
    const int64_t kv = k.size(-1) / head_dim_;
    q = kernels::qk_norm_rotary_cache_write(
        q.reshape({b, heads_, head_dim_}), k.reshape({b, kv, head_dim_}), v.reshape({b, kv, head_dim_}),
        q_norm ? q_norm->weight : torch::Tensor(), k_norm ? k_norm->weight : torch::Tensor(), eps_,
        cos.reshape({b, head_dim_}), sin.reshape({b, head_dim_}), cached_k, cached_v, access.tables, access.lengths);
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));
    auto attended = kernels::paged_decode_attention(q, cached_k, cached_v, access.tables, access.lengths, access.span,
                                                    scale, access.sliding_window);
    const auto heads = attended.reshape({b, heads_ * head_dim_});
    if (kernels::few_rows_linear_applies(heads, {o_proj->weight}))
      return kernels::few_rows_linear(heads, {o_proj->weight}, {o_proj->bias})[0].view({b, 1, -1});
    return row_parallel(heads.view({b, 1, heads_ * head_dim_}), o_proj, tp_, o_lora);
  }
  TensorParallelGroup tp_;
  int64_t heads_, head_dim_;
  bool replicated_kv_;
  double eps_;
  int64_t kv_heads_ = 0, all_kv_heads_ = 0, kv_index_ = 0;
};
TORCH_MODULE(Attention);

class MLPImpl : public torch::nn::Module {
 public:
  MLPImpl(const ModelConfig& c, const TensorParallelGroup& tp) : tp_(tp) {
    const int64_t local = even_partition(c.intermediate_size, tp.size(), tp.rank(), "intermediate_size").length;
    gate_proj = register_module("gate_proj", linear(c.hidden_size, local, false));
    up_proj = register_module("up_proj", linear(c.hidden_size, local, false));
    down_proj = register_module("down_proj", linear(local, c.hidden_size, false));
  }
  // `fused`: silu(gate) * up as one kernel (the no-grad decode step, kernels/decode_kernels.h).
  torch::Tensor forward(const torch::Tensor& x, bool fused = false) {
    if (fused) {
      // At a few rows: the gate and up projections and SwiGLU as one kernel, the down projection as another.
      const auto rows = x.reshape({-1, x.size(-1)});
      if (kernels::few_rows_linear_applies(rows, {gate_proj->weight, up_proj->weight})) {
        const auto features = kernels::few_rows_swiglu(rows, gate_proj->weight, up_proj->weight);
        auto sizes = x.sizes().vec();
        if (kernels::few_rows_linear_applies(features, {down_proj->weight})) {
          sizes.back() = down_proj->weight.size(0);
          return kernels::few_rows_linear(features, {down_proj->weight})[0].view(sizes);
        }
        sizes.back() = features.size(-1);
        return row_parallel(features.view(sizes), down_proj, tp_, down_lora);
      }
    }
    auto x_tp = copy_to_tensor_parallel(x, tp_);
    // Up before gate: the order the two projections enter the autograd graph sets the order their gradients add
    // into x's, and tests compare split runs with one process at 1e-5 after several LoRA steps (the order of
    // the unfused expression `silu(gate) * up` as GCC evaluated it).
    auto up = lora::project(up_proj, up_lora, x, x_tp);
    auto gate = lora::project(gate_proj, gate_lora, x, x_tp);
    auto features = fused ? kernels::swiglu(gate, up) : torch::silu(gate) * up;
    return row_parallel(features, down_proj, tp_, down_lora);
  }
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  std::shared_ptr<lora::Branch> gate_lora, up_lora, down_lora;  // LoRA adapters, when added

 private:
  TensorParallelGroup tp_;
};
TORCH_MODULE(MLP);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  // `index`: the layer's place in the whole model, which decides whether its MLP is sparse.
  DecoderLayerImpl(const ModelConfig& c, const TensorParallelGroup& tp, int64_t index) {
    input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
    self_attn = register_module("self_attn", Attention(c, tp));
    post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
    if (c.moe_layer(index))
      sparse = register_module(c.moe_block_name(), moe::SparseBlock(c));
    else
      mlp = register_module("mlp", MLP(c, tp));
  }
  torch::Tensor feed_forward(const torch::Tensor& x, const moe::LayerIO& io = {}, bool fused = false) {
    return sparse ? sparse->forward(x, io) : mlp->forward(x, fused);
  }
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  Attention self_attn{nullptr};
  MLP mlp{nullptr};              // a dense layer's
  moe::SparseBlock sparse{nullptr};  // a mixture-of-experts layer's, instead
};
TORCH_MODULE(DecoderLayer);

// HF's LlamaModel / Qwen2Model, registered as "model". The embedding is vocabulary-parallel: each rank looks
// up the ids in its slice and the group sums the rows (ids elsewhere give zeros). Under pipeline parallelism
// a stage holds only its layers (registered under their global indices, so names match the checkpoint),
// the embedding when it is the first stage or needs it as a tied head, and the final norm when it is last.
class BackboneImpl : public torch::nn::Module {
 public:
  BackboneImpl(const ModelConfig& c, const TensorParallelGroup& tp, const PipelineStage& pp, Partition layers,
               bool needs_embedding)
      : tp_(tp), vocab_(even_partition(c.vocab_size, tp.size(), tp.rank(), "vocab_size")) {
    if (needs_embedding)
      embed_tokens = register_module("embed_tokens", torch::nn::Embedding(vocab_.length, c.hidden_size));
    layers_holder = register_module("layers", std::make_shared<torch::nn::Module>());
    for (int64_t i = layers.start; i < layers.start + layers.length; ++i) {
      decoder_layers.push_back(DecoderLayer(c, tp, i));
      layers_holder->register_module(std::to_string(i), decoder_layers.back());
    }
    if (pp.last()) norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  }
  torch::Tensor embed(const torch::Tensor& ids) {
    if (!tp_.enabled()) return embed_tokens(ids);
    auto local = ids - vocab_.start;
    auto outside = local.lt(0).logical_or(local.ge(vocab_.length));
    auto rows = torch::embedding(embed_tokens->weight, local.masked_fill(outside, 0));
    return reduce_from_tensor_parallel(rows.masked_fill(outside.unsqueeze(-1), 0.0), tp_);
  }
  TensorParallelGroup tp_;
  Partition vocab_;
  torch::nn::Embedding embed_tokens{nullptr};
  std::shared_ptr<torch::nn::Module> layers_holder;
  std::vector<DecoderLayer> decoder_layers;  // this stage's layers, in order
  RMSNorm norm{nullptr};
};
TORCH_MODULE(Backbone);

}  // namespace

namespace {

// Every decoder projection of the model with its ordinal (global layer x 7 + its place in the layer, the same
// in every pipeline layout), its path ("model.layers.3.self_attn.q_proj") and its LoRA slot, in model order
// (layers, then q, k, v, o, gate, up, down as PEFT lists them).
template <typename Visit>
void for_each_lora_projection(Backbone& backbone, Partition layers, Visit&& visit) {
  for (int64_t i = 0; i < layers.length; ++i) {
    auto& layer = *backbone->decoder_layers[i];
    const int64_t global = layers.start + i;
    const std::string prefix = "model.layers." + std::to_string(global) + ".";
    auto& attn = *layer.self_attn;
    const int64_t first = global * 7;
    visit(first + 0, prefix + "self_attn.q_proj", attn.q_proj, attn.q_lora);
    visit(first + 1, prefix + "self_attn.k_proj", attn.k_proj, attn.k_lora);
    visit(first + 2, prefix + "self_attn.v_proj", attn.v_proj, attn.v_lora);
    visit(first + 3, prefix + "self_attn.o_proj", attn.o_proj, attn.o_lora);
    if (!layer.mlp) continue;  // a sparse layer: its experts, router and shared expert take no adapters
    auto& mlp = *layer.mlp;
    visit(first + 4, prefix + "mlp.gate_proj", mlp.gate_proj, mlp.gate_lora);
    visit(first + 5, prefix + "mlp.up_proj", mlp.up_proj, mlp.up_lora);
    visit(first + 6, prefix + "mlp.down_proj", mlp.down_proj, mlp.down_lora);
  }
}

// The weights of this stage's decoder layers as the fused decode and batch-invariant kernels read them.
std::vector<fused_decode::LayerWeights> kernel_layer_weights(Backbone& m, int64_t local_layers) {
  std::vector<fused_decode::LayerWeights> weights;
  for (int64_t i = 0; i < local_layers; ++i) {
    auto& layer = *m->decoder_layers[i];
    auto& attn = *layer.self_attn;
    weights.push_back({layer.input_layernorm->weight, layer.post_attention_layernorm->weight, attn.q_proj->weight,
                       attn.k_proj->weight, attn.v_proj->weight, attn.o_proj->weight, attn.q_proj->bias,
                       attn.k_proj->bias, attn.v_proj->bias, attn.o_proj->bias,
                       attn.q_norm ? attn.q_norm->weight : torch::Tensor(),
                       attn.k_norm ? attn.k_norm->weight : torch::Tensor(), layer.mlp->gate_proj->weight,
                       layer.mlp->up_proj->weight, layer.mlp->down_proj->weight});
  }
  return weights;
}

// Whether a decode step of h over these pools runs through the fused decode kernels (kernels/decode_kernels.h):
// their mode covers h's device, gradients are off, the model is one rank without adapters' branches (`plain`),
// and the shapes and dtypes are the kernels' (pools contiguous, everything in h's dtype).
bool decode_kernels_apply(const torch::Tensor& h, const std::vector<torch::Tensor>& keys,
                          const std::vector<torch::Tensor>& values, const ModelConfig& c, BackboneImpl& m, bool plain) {
  if (!plain || keys.empty() || m.decoder_layers.empty() || torch::GradMode::is_enabled() ||
      !kernels::active_for(h.device()))
    return false;
  const auto dtype = h.scalar_type();
  if (!keys[0].defined() || !kernels::supports(dtype, c.num_attention_heads, keys[0].size(1), c.head_dim()))
    return false;
  for (size_t i = 0; i < keys.size(); ++i)
    if (!keys[i].defined() || !values[i].defined() || !keys[i].is_contiguous() || !values[i].is_contiguous() ||
        keys[i].scalar_type() != dtype || values[i].scalar_type() != dtype)
      return false;
  return m.decoder_layers[0]->input_layernorm->weight.scalar_type() == dtype &&
         (!m.norm || m.norm->weight.scalar_type() == dtype);
}

fused_decode::Shape kernel_shape(const ModelConfig& c) {
  return {c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim(), c.intermediate_size,
          c.rms_norm_eps, c.sliding_window};
}

}  // namespace

struct CausalLMImpl::Layers {
  Backbone model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // undefined when tied or for a value head
  torch::nn::Linear score{nullptr};    // value head only
};

void KVCache::select_rows(const torch::Tensor& rows) {
  for (auto& k : keys)
    if (k.defined()) k = k.index_select(0, rows.to(k.device()));
  for (auto& v : values)
    if (v.defined()) v = v.index_select(0, rows.to(v.device()));
}

torch::Tensor position_ids_from_mask(const torch::Tensor& attention_mask) {
  auto mask = attention_mask.to(torch::kInt64);
  return (mask.cumsum(1) - 1).clamp_min(0).masked_fill(mask == 0, 0);
}

CausalLMImpl::CausalLMImpl(const ModelConfig& config, HeadKind head, TensorParallelGroup tp, PipelineStage pp)
    : config_(config), head_(head), tp_(tp), pp_(pp), layers_(std::make_shared<Layers>()) {
  config_.validate();
  check_tensor_parallel(config_, tp_.size());
  // Before any module is built: an absurd config (num_hidden_layers: 1000000) must fail here, naming its keys,
  // not in the allocator after taking the machine's memory. This rank holds about 1/(tp x pp) of the model.
  check_model_fits_memory(config_, head_ == HeadKind::kValue, static_cast<double>(torch::get_default_dtype().itemsize()),
                          1.0 / (static_cast<double>(tp_.size()) * pp_.stages), "model config");
  layer_range_ = hybridflow::stage_layers(config_.num_hidden_layers, pp_);
  const bool tied_head = head_ == HeadKind::kLanguageModel && config_.tie_word_embeddings;
  layers_->model = register_module(
      "model", Backbone(config_, tp_, pp_, layer_range_, pp_.first() || (pp_.last() && tied_head)));
  if (!pp_.last()) {
    // No head before the last stage.
  } else if (head_ == HeadKind::kValue) {
    layers_->score =
        register_module("score", torch::nn::Linear(torch::nn::LinearOptions(config_.hidden_size, 1).bias(false)));
  } else if (!config_.tie_word_embeddings) {
    layers_->lm_head =
        register_module("lm_head", linear(config_.hidden_size, layers_->model->vocab_.length, /*bias=*/false));
  }
  // HF's _init_weights: normal(0, 0.02) for linear and embedding weights, zero biases, unit norms.
  torch::NoGradGuard no_grad;
  for (auto& item : named_parameters()) {
    const std::string& name = item.key();
    auto& p = item.value();
    if (name.size() >= 11 && name.compare(name.size() - 11, 11, "norm.weight") == 0) {
      p.fill_(1.0);
    } else if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      p.zero_();
    } else {
      p.normal_(0.0, 0.02);
    }
  }
}

ForwardOutput CausalLMImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                    const torch::Tensor& position_ids, KVCache* cache) {
  return apply_head(hidden_states(input_ids, attention_mask, position_ids, cache));
}

void CausalLMImpl::set_sequence_parallel(SequenceParallelGroup sp) {
  if (sp.enabled()) {
    // The group splits this rank's heads: all of them, or under tensor parallelism its tensor-parallel share.
    const int n = sp.size();
    const RankHeads heads =
        tensor_parallel_rank_heads(config_.num_attention_heads, config_.num_key_value_heads, tp_.size());
    const std::string local = tp_.enabled() ? " (" + std::to_string(heads.query) + " query and " +
                                                  std::to_string(heads.kv) + " KV heads on each of " +
                                                  "tensor_model_parallel_size " + std::to_string(tp_.size()) + " ranks)"
                                            : std::string();
    HF_CHECK(sequence_parallel_splits(heads, n), "ulysses_sequence_parallel_size ", n,
             " does not split num_attention_heads = ", config_.num_attention_heads, " and num_key_value_heads = ",
             config_.num_key_value_heads, local, ": each rank attends with an equal share of the query heads and ",
             "whole KV heads (repeated when there are fewer than ranks); choose a size that divides the query heads ",
             "and divides or is a multiple of the KV heads");
  }
  sp_ = sp;
}

void CausalLMImpl::set_expert_parallel(ExpertParallelGroup ep, bool over_tensor_parallel) {
  HF_CHECK(!ep_.enabled(), "expert_model_parallel_size: the experts are already split over ", ep_.size(), " ranks");
  if (!ep.enabled()) return;
  const int n = ep.size();
  HF_CHECK(config_.num_moe_layers() > 0, "expert_model_parallel_size ", n, ": ", config_.model_type,
           " has no mixture-of-experts layer to split");
  HF_CHECK(config_.moe.num_experts % n == 0, "expert_model_parallel_size ", n, " does not divide num_experts = ",
           config_.moe.num_experts, "; choose a size that divides the expert count");
  for (auto& layer : layers_->model->decoder_layers)
    if (layer->sparse) layer->sparse->shard_experts(ep, over_tensor_parallel ? tp_ : TensorParallelGroup());
  ep_ = ep;
  ep_over_tp_ = over_tensor_parallel && tp_.enabled();
}

ExpertGather CausalLMImpl::gather_experts(bool even_when_folded) {
  ExpertGather moved;
  if (!ep_.enabled() || experts_gathered_ || (experts_follow_tensor_parallel() && !even_when_folded)) return moved;
  for (auto& layer : layers_->model->decoder_layers)
    if (layer->sparse) layer->sparse->gather_experts(moved);
  experts_gathered_ = true;
  return moved;
}

void CausalLMImpl::release_gathered_experts() {
  for (auto& layer : layers_->model->decoder_layers)
    if (layer->sparse) layer->sparse->release_gathered_experts();
  experts_gathered_ = false;
}

std::map<std::string, torch::Tensor> CausalLMImpl::gathered_expert_weights() const {
  HF_CHECK(experts_gathered_, "CausalLM::gathered_expert_weights: the experts are not gathered (gather_experts())");
  std::map<std::string, torch::Tensor> out;
  const auto& layers = layers_->model->decoder_layers;
  for (size_t i = 0; i < layers.size(); ++i)
    if (layers[i]->sparse)
      layers[i]->sparse->add_gathered_expert_weights(
          "model.layers." + std::to_string(layer_range_.start + static_cast<int64_t>(i)) + "." +
              config_.moe_block_name(),
          out);
  return out;
}

torch::Tensor CausalLMImpl::hidden_states(const torch::Tensor& given_ids, const torch::Tensor& attention_mask,
                                          const torch::Tensor& position_ids, KVCache* cache) {
  HF_CHECK(cache == nullptr || !experts_need_lockstep() || cache->expert_parallel_lockstep,
           "CausalLM: generation with a KV cache under expert parallelism runs on gathered experts ",
           "(gather_experts()) unless its ranks take the same steps (KVCache::expert_parallel_lockstep)");
  HF_CHECK(given_ids.dim() == 2, "CausalLM::forward: input_ids must be [batch, seq], got ", given_ids.sizes());
  // Sequence parallelism (whole-sequence forwards; generation with a cache runs whole on every rank): the
  // sequence is padded to a multiple of the group size with masked positions, each rank embeds and runs its
  // slice through the layers, and the final hidden states are gathered and cut back to the given length.
  const bool split_sequence = sp_.enabled() && cache == nullptr;
  const int64_t given_len = given_ids.size(1);
  const int64_t pad = split_sequence ? sequence_parallel_padded_length(given_len, sp_.size()) - given_len : 0;
  const torch::Tensor input_ids = pad > 0 ? torch::constant_pad_nd(given_ids, {0, pad}) : given_ids;
  const int64_t b = input_ids.size(0), t = input_ids.size(1);
  const int64_t past = cache != nullptr ? cache->length() : 0;
  const int64_t total = past + t;
  const auto device = input_ids.device();
  torch::Tensor mask = attention_mask.defined()
                           ? attention_mask.to(device, torch::kInt64)
                           : torch::ones({b, total - pad}, torch::TensorOptions().dtype(torch::kInt64).device(device));
  HF_CHECK(mask.dim() == 2 && mask.size(0) == b && mask.size(1) == total - pad,
           "CausalLM::forward: attention_mask must be [", b, ", ", total - pad, "] (cache length ", past, " + ",
           t - pad, " new tokens), got ", mask.sizes());
  // Packed rows (values above 1 number the sequences of a row): attention stays within each sequence.
  const bool packed = cache == nullptr && mask.numel() > 0 && mask.max().item<int64_t>() > 1;
  torch::Tensor positions = position_ids.defined() ? position_ids.to(device, torch::kInt64)
                            : packed               ? packed_position_ids(mask)
                                                   : position_ids_from_mask(mask).slice(1, past);
  HF_CHECK(positions.sizes() == given_ids.sizes(), "CausalLM::forward: position_ids must be [", b, ", ",
           t - pad, "], got ", positions.sizes());
  // Before the group's padding: rows without padding of their own attend causally with no mask.
  const bool unpadded = cache == nullptr && !packed && mask.numel() > 0 && mask.ne(0).all().item<bool>();
  if (pad > 0) {
    mask = torch::constant_pad_nd(mask, {0, pad});
    positions = torch::constant_pad_nd(positions, {0, pad});
  }
  const int64_t local_layers = layer_range_.length;
  if (cache != nullptr && cache->keys.empty()) {
    cache->keys.resize(local_layers);
    cache->values.resize(local_layers);
  }

  // Without a cache, and with no sliding window shorter than the sequence, attention is causal within each
  // sequence and needs no [B, 1, T, S] mask (4 GiB of fp32 at 32k x 32k): see causal_layout.
  const bool window_bites = config_.sliding_window > 0 && config_.sliding_window < total;
  const CausalLayout layout = cache == nullptr && !window_bites ? causal_layout(mask, packed, unpadded) : CausalLayout::kMask;
  const auto runs = layout == CausalLayout::kRuns ? std::make_shared<const SequenceRuns>(sequence_runs(mask[0]))
                                                  : nullptr;
  auto& m = *layers_->model;
  torch::Tensor h;
  const int64_t slice = split_sequence ? t / sp_.size() : t;
  if (pp_.first()) {
    h = m.embed(split_sequence ? input_ids.narrow(1, sp_.rank() * slice, slice) : input_ids);
  } else {
    HF_CHECK(stage_input_.defined(), "CausalLM::forward: pipeline stage ", pp_.stage,
             " needs the previous stage's hidden states (set_stage_input) before its forward");
    h = std::exchange(stage_input_, torch::Tensor());  // used once: the next forward needs its own input
    HF_CHECK(h.dim() == 3 && h.size(0) == b && h.size(1) == slice && h.size(2) == config_.hidden_size,
             "CausalLM::forward: pipeline stage ", pp_.stage, " got hidden states of shape ", h.sizes(),
             " for input_ids of shape ", input_ids.sizes(),
             split_sequence ? " split over the sequence-parallel group" : "");
  }
  if (batch_invariant_active()) return batch_invariant_hidden_states(h, mask, positions, past, cache);
  // SDPA takes an additive mask in the activations' dtype; built once per forward, shared by the layers.
  torch::Tensor mask_bias;
  if (layout == CausalLayout::kMask) {
    // Query i (absolute position past + i) sees key j when j <= past + i and key j is not padding.
    auto query_pos = torch::arange(past, total, torch::TensorOptions().dtype(torch::kInt64).device(device));
    auto key_pos = torch::arange(total, torch::TensorOptions().dtype(torch::kInt64).device(device));
    auto causal = key_pos.unsqueeze(0).le(query_pos.unsqueeze(1));
    // Mistral's window: query i sees key j only when i - j < sliding_window (transformers' sliding mask).
    if (config_.sliding_window > 0)
      causal = causal & key_pos.unsqueeze(0).gt(query_pos.unsqueeze(1) - config_.sliding_window);
    auto visible = causal.unsqueeze(0) & mask.ne(0).unsqueeze(1);  // [B, T, S]
    if (packed) visible = visible & mask.unsqueeze(2).eq(mask.unsqueeze(1));  // several packed rows
    mask_bias = torch::zeros({b, 1, t, total}, torch::TensorOptions().dtype(h.scalar_type()).device(device))
                    .masked_fill(visible.logical_not().unsqueeze(1), masked_score(h.scalar_type()));
  }
  auto [cos, sin] = rotary_cos_sin(positions, config_, h.scalar_type());
  // Mixture of experts: what this forward's sparse layers replay, record and keep (set_router_replay,
  // set_keep_router_logits), one slot per sparse layer of this stage.
  int64_t sparse_layers = 0;
  for (const auto& layer : m.decoder_layers) sparse_layers += layer->sparse ? 1 : 0;
  std::vector<torch::Tensor> replay(sparse_layers), experts(sparse_layers), router_logits(sparse_layers),
      differs(sparse_layers);
  if (router_replay_ == RouterReplayMode::kReplay) {
    HF_CHECK(static_cast<int64_t>(replay_routing_.layers.size()) == sparse_layers, "router replay: the routing to ",
             "replay covers ", replay_routing_.layers.size(), " MoE layers, this model (stage) has ", sparse_layers);
    for (int64_t j = 0; j < sparse_layers; ++j) {
      const auto& given = replay_routing_.layers[static_cast<size_t>(j)];
      HF_CHECK(given.dim() == 3 && given.size(0) == b && given.size(1) == t - pad, "router replay: MoE layer ", j,
               " needs experts of shape [", b, ", ", t - pad, ", k] for this forward, got ", given.sizes());
      // Under sequence parallelism this rank replays its slice (the group's padding routes to expert 0, masked).
      const torch::Tensor mine =
          split_sequence ? torch::constant_pad_nd(given, {0, 0, 0, pad}).narrow(1, sp_.rank() * slice, slice) : given;
      replay[static_cast<size_t>(j)] = mine.reshape({b * slice, given.size(2)});
    }
  }
  // Activation checkpointing (training passes only: a cache means generation) keeps each layer's input alone.
  const bool recompute = gradient_checkpointing_ && cache == nullptr;
  const SequenceParallelGroup sp = split_sequence ? sp_ : SequenceParallelGroup();
  int64_t sparse_index = 0;
  for (int64_t i = 0; i < local_layers; ++i) {
    moe::LayerIO io;
    const bool sparse = static_cast<bool>(m.decoder_layers[i]->sparse);
    if (sparse) {
      const auto j = static_cast<size_t>(sparse_index++);
      if (router_replay_ == RouterReplayMode::kReplay) {
        io.replay = &replay[j];
        io.differs = &differs[j];
      }
      if (router_replay_ == RouterReplayMode::kRecord) io.experts = &experts[j];
      if (keep_router_logits_) io.router_logits = &router_logits[j];
    }
    // The load-balancing loss needs the router logits' graph, which a checkpointed first pass does not build:
    // sparse layers then run without checkpointing.
    // Under expert parallelism they also run once, so their exchanges with the group are not repeated.
    if (recompute && !(sparse && (keep_router_logits_ || ep_.enabled()))) {
      // Captures by value: the layer runs again in the backward pass, after this call returned. Only the first
      // pass writes the outputs (their slots are gone by then); a replay is replayed again.
      auto first = std::make_shared<bool>(true);
      torch::Tensor replayed = io.replay != nullptr ? *io.replay : torch::Tensor();
      h = checkpointed(
          [layer = m.decoder_layers[i], cos, sin, mask_bias, io, first, replayed, sp, runs](const torch::Tensor& x) mutable {
            moe::LayerIO use = *first ? io : moe::LayerIO{};
            *first = false;
            if (replayed.defined()) use.replay = &replayed;
            torch::Tensor y = x + layer->self_attn->forward(layer->input_layernorm(x), cos, sin, mask_bias, nullptr,
                                                            nullptr, 0, 0, nullptr, sp, runs.get());
            return y + layer->feed_forward(layer->post_attention_layernorm(y), use);
          },
          h);
      continue;
    }
    auto& layer = *m.decoder_layers[i];
    torch::Tensor* ck = cache != nullptr ? &cache->keys[i] : nullptr;
    torch::Tensor* cv = cache != nullptr ? &cache->values[i] : nullptr;
    h = h + layer.self_attn->forward(layer.input_layernorm(h), cos, sin, mask_bias, ck, cv, past,
                                     cache != nullptr ? cache->capacity : 0, nullptr, sp, runs.get());
    h = h + layer.feed_forward(layer.post_attention_layernorm(h), io);
  }
  // Under sequence parallelism each rank routed its slice of the sequence: what callers read of the routing
  // (recorded experts, replay mismatches, the router logits of the load-balancing loss) covers the whole of it.
  // The logits' gather keeps the gradient convention of gather_sequence (the loss runs on every rank).
  const auto whole_sequence = [&](const torch::Tensor& slice_rows) {  // [b * slice, ...] -> [b, given length, ...]
    auto rows = slice_rows.reshape({b, slice, -1});
    if (!split_sequence) return rows;
    return sp_.comm()->all_gather_cat(rows.contiguous(), 1).narrow(1, 0, given_len);
  };
  if (router_replay_ == RouterReplayMode::kRecord) {
    recorded_routing_.layers.clear();
    for (auto& e : experts) recorded_routing_.layers.push_back(whole_sequence(e));
  }
  if (router_replay_ == RouterReplayMode::kReplay) {
    replay_differs_ = torch::zeros({b, t - pad}, torch::TensorOptions().dtype(torch::kBool).device(device));
    for (auto& d : differs)
      replay_differs_ = replay_differs_.logical_or(whole_sequence(d.to(torch::kUInt8)).view({b, t - pad}).ne(0));
  }
  if (keep_router_logits_) {
    if (split_sequence)
      for (auto& logits : router_logits) {
        const int64_t experts_n = logits.size(-1);
        logits = gather_sequence(logits.reshape({b, slice, experts_n}), sp_).reshape({b * t, experts_n});
      }
    router_logits_ = std::move(router_logits);
    router_logits_mask_ = packed ? mask.slice(1, past).ne(0).to(mask.scalar_type()) : mask.slice(1, past);
  }
  if (cache != nullptr) cache->filled = total;
  // Under sequence parallelism a stage before the last passes its slice on (stage_activation_like).
  if (!pp_.last()) return h;
  if (split_sequence) return gather_sequence(m.norm(h), sp_).narrow(1, 0, given_len);
  return m.norm(h);
}

Partition CausalLMImpl::stage_moe_layers() const {
  Partition moe;
  for (int64_t i = 0; i < layer_range_.start + layer_range_.length; ++i)
    if (config_.moe_layer(i)) ++(i < layer_range_.start ? moe.start : moe.length);
  return moe;
}

void CausalLMImpl::set_router_replay(RouterReplayMode mode, ExpertRouting replay) {
  HF_CHECK(mode != RouterReplayMode::kReplay || !replay.empty() || config_.num_moe_layers() == 0,
           "router replay: replay mode needs the routing to replay");
  const Partition moe = stage_moe_layers();
  if (pp_.enabled() && static_cast<int64_t>(replay.layers.size()) == config_.num_moe_layers() &&
      moe.length != config_.num_moe_layers()) {  // the whole model's routing: this stage's layers of it
    const auto first = replay.layers.begin() + moe.start;
    replay.layers = std::vector<torch::Tensor>(first, first + moe.length);
  }
  router_replay_ = mode;
  replay_routing_ = mode == RouterReplayMode::kReplay ? std::move(replay) : ExpertRouting{};
  recorded_routing_ = {};
  replay_differs_ = torch::Tensor();
}

void CausalLMImpl::set_keep_router_logits(bool keep) {
  keep_router_logits_ = keep;
  router_logits_.clear();
  router_logits_mask_ = torch::Tensor();
}

torch::Tensor CausalLMImpl::load_balancing_loss() const {
  HF_CHECK(keep_router_logits_ && !router_logits_.empty(), "CausalLM::load_balancing_loss: no router logits kept ",
           "(set_keep_router_logits(true), then a forward of a model with MoE layers)");
  HF_CHECK(!pp_.enabled(), "CausalLM::load_balancing_loss: the loss spans every layer; pipeline stage ", pp_.stage,
           " holds only some");
  return hybridflow::load_balancing_loss(router_logits_, config_.moe.num_experts, config_.moe.num_experts_per_tok,
                                         router_logits_mask_);
}

torch::Tensor CausalLMImpl::decode_slots(const torch::Tensor& input_ids, const std::vector<int64_t>& slots,
                                         const std::vector<int64_t>& lengths, KVCache& cache) {
  const int64_t local_layers = layer_range_.length;
  HF_CHECK(static_cast<int64_t>(cache.keys.size()) == local_layers && (local_layers == 0 || cache.keys[0].defined()),
           "CausalLM::decode_slots: the slot cache holds no slabs for this stage's ", local_layers,
           " layers (a prefill writes them first)");
  const int64_t capacity = local_layers > 0 ? cache.keys[0].size(2) : 0;
  return decode_blocks(input_ids, slots, 1, capacity, lengths, cache.keys, cache.values, "decode_slots");
}

torch::Tensor CausalLMImpl::decode_paged(const torch::Tensor& input_ids, const std::vector<std::vector<int64_t>>& tables,
                                         const std::vector<int64_t>& lengths, PagedKVCache& cache) {
  const int64_t local_layers = layer_range_.length;
  HF_CHECK(static_cast<int64_t>(cache.keys.size()) == local_layers && (local_layers == 0 || cache.keys[0].defined()),
           "CausalLM::decode_paged: the paged cache holds no block pools for this stage's ", local_layers, " layers");
  size_t width = 1;
  for (const auto& t : tables) width = std::max(width, t.size());
  // Rows with shorter tables name block 0 past their end: read only at masked positions.
  std::vector<int64_t> flat(tables.size() * width, 0);
  for (size_t r = 0; r < tables.size(); ++r) std::copy(tables[r].begin(), tables[r].end(), flat.begin() + r * width);
  return decode_blocks(input_ids, flat, static_cast<int64_t>(width), cache.block_size(), lengths, cache.keys,
                       cache.values, "decode_paged");
}

torch::Tensor CausalLMImpl::decode_blocks(const torch::Tensor& input_ids, const std::vector<int64_t>& tables,
                                          int64_t width, int64_t block_size, const std::vector<int64_t>& lengths,
                                          std::vector<torch::Tensor>& keys, std::vector<torch::Tensor>& values,
                                          const char* caller) {
  const int64_t b = input_ids.size(0);
  HF_CHECK(input_ids.dim() == 2 && input_ids.size(1) == 1 && static_cast<int64_t>(tables.size()) == b * width &&
               static_cast<int64_t>(lengths.size()) == b,
           "CausalLM::", caller, ": input_ids must be [rows, 1] with a slot or block table and a length per row, got ",
           input_ids.sizes(), ", ", tables.size() / static_cast<size_t>(std::max<int64_t>(width, 1)), " tables and ",
           lengths.size(), " lengths");
  const int64_t local_layers = layer_range_.length;
  HF_CHECK(router_replay_ != RouterReplayMode::kReplay && !keep_router_logits_, "CausalLM::", caller,
           ": router replay and kept router logits are for whole-sequence forwards, not decode steps");
  const int64_t pool_blocks = local_layers > 0 ? keys[0].size(0) : 0;
  const bool paged = std::string_view(caller) == "decode_paged";
  int64_t longest = 0;
  for (int64_t r = 0; r < b; ++r) {
    HF_CHECK(lengths[r] >= 0 && lengths[r] < width * block_size, "CausalLM::", caller, ": row ", r, " has ",
             lengths[r], " cached positions; its ", paged ? "block table" : "slot", " holds ", width * block_size);
    for (int64_t j = 0; j <= lengths[r] / block_size; ++j) {
      const int64_t block = tables[static_cast<size_t>(r * width + j)];
      HF_CHECK(block >= 0 && block < pool_blocks, "CausalLM::", caller, ": row ", r, " names ",
               paged ? "block " : "slot ", block, " of ", pool_blocks);
    }
    longest = std::max(longest, lengths[r] + 1);
  }
  const auto device = input_ids.device();
  auto& m = *layers_->model;
  torch::Tensor h;
  if (pp_.first()) {
    h = m.embed(input_ids);
  } else {
    HF_CHECK(stage_input_.defined(), "CausalLM::", caller, ": pipeline stage ", pp_.stage,
             " needs the previous stage's hidden states (set_stage_input) first");
    h = std::exchange(stage_input_, torch::Tensor());
    HF_CHECK(h.dim() == 3 && h.size(0) == b && h.size(1) == 1 && h.size(2) == config_.hidden_size,
             "CausalLM::", caller, ": pipeline stage ", pp_.stage, " got hidden states of shape ", h.sizes(), " for ",
             b, " rows");
  }
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  auto length_t = upload(torch::tensor(lengths, i64), device);
  auto [cos, sin] = rotary_cos_sin(length_t.view({b, 1}), config_, h.scalar_type());  // [b, 1, 1, d]

  if (batch_invariant_active()) {
    std::vector<int64_t> rows(static_cast<size_t>(b));
    for (int64_t r = 0; r < b; ++r) rows[static_cast<size_t>(r)] = r;
    batch_invariant::Tokens tokens{rows, lengths, lengths, nullptr, 0};
    return batch_invariant_layers(h, tokens, keys, values, {tables.data(), width, block_size});
  }
  // Few operators instead of ~50 per layer where the fused CPU kernels apply (fp32, no tensor parallelism), unless
  // the fused decode kernels' CPU references stand in for their CUDA kernels (kernels::Mode::kEverywhere, tests).
  std::vector<fused_decode::LayerWeights> weights;
  if (!tp_.enabled() && !lora_branches_active() && !torch::GradMode::is_enabled() && h.device().is_cpu() &&
      kernels::mode() != kernels::Mode::kEverywhere &&
      h.scalar_type() == torch::kFloat32 && config_.num_moe_layers() == 0) {
    weights = kernel_layer_weights(layers_->model, local_layers);
    bool pools_fit = true;
    for (int64_t i = 0; i < local_layers; ++i)
      pools_fit = pools_fit && keys[i].is_contiguous() && values[i].is_contiguous() &&
                  keys[i].scalar_type() == torch::kFloat32 && values[i].scalar_type() == torch::kFloat32;
    auto flat = h.reshape({b, config_.hidden_size}).contiguous();
    const fused_decode::Shape shape = kernel_shape(config_);
    if (pools_fit && fused_decode::supports(flat, shape, weights)) {
      const int64_t d = config_.head_dim();
      fused_decode::decode_layers(flat, shape, weights, keys, values, {tables.data(), width, block_size}, lengths,
                                  cos.reshape({b, d}).contiguous(), sin.reshape({b, d}).contiguous());
      h = flat.view({b, 1, config_.hidden_size});
      return pp_.last() ? m.norm(h) : h;
    }
  }

  HF_CHECK(!experts_need_lockstep(), "CausalLM::", caller, ": decoding under expert parallelism runs on gathered ",
           "experts (gather_experts()), since its ranks take different steps");
  // The block tables and lengths go to the device once each; every write and read position is computed there.
  torch::Tensor table_t =
      upload(torch::from_blob(const_cast<int64_t*>(tables.data()), {b, width}, i64), device);
  const int64_t kv = local_layers > 0 ? keys[0].size(1) : 0;
  const bool kernels_apply = decode_kernels_apply(h, keys, values, config_, m, !tp_.enabled() && !lora_branches_active());
  SlotAccess access = decode_step_access(table_t, length_t, block_size, longest, kv, paged, kernels_apply);
  access.sliding_window = config_.sliding_window;
  bool in_order = !paged;
  for (int64_t r = 0; in_order && r < b; ++r) in_order = tables[static_cast<size_t>(r)] == r;
  if (in_order) access.slots = torch::Tensor();  // row r is slot r: the cache is read as a view
  const auto mask_bias = kernels_apply ? torch::Tensor()
                                       : decode_step_mask_bias(length_t, longest, config_.sliding_window, h.scalar_type());
  return decode_layers(h, cos, sin, mask_bias, access, keys, values);
}


torch::Tensor CausalLMImpl::decode_layers(torch::Tensor h, const torch::Tensor& cos, const torch::Tensor& sin,
                                          const torch::Tensor& mask_bias, const SlotAccess& access,
                                          std::vector<torch::Tensor>& keys, std::vector<torch::Tensor>& values) {
  auto& m = *layers_->model;
  const int64_t b = h.size(0), local_layers = layer_range_.length;
  // Recording (generation's router replay): each row's experts for its one input token, [rows, 1, k] per layer.
  const bool record = router_replay_ == RouterReplayMode::kRecord;
  std::vector<torch::Tensor> experts;
  torch::Tensor normed;  // the fused kernels' path: the next norm's output, made with the residual add before it
  if (access.kernels) {
    // Each residual add and the norm after it in one kernel; the attention and SwiGLU as kernels too.
    const double eps = config_.rms_norm_eps;
    normed = kernels::rms_norm(h, m.decoder_layers[0]->input_layernorm->weight, eps);
    for (int64_t i = 0; i < local_layers; ++i) {
      auto& layer = *m.decoder_layers[i];
      auto attended = layer.self_attn->forward(normed, cos, sin, mask_bias, &keys[i], &values[i], 0, 0, &access);
      auto post = kernels::add_rms_norm(h, attended, layer.post_attention_layernorm->weight, eps);
      moe::LayerIO io;
      if (record && layer.sparse) io.experts = &experts.emplace_back();
      auto fed = layer.feed_forward(post.normed, io, /*fused=*/true);
      const bool next = i + 1 < local_layers;
      if (next || pp_.last()) {
        auto sum = kernels::add_rms_norm(post.sum, fed,
                                         next ? m.decoder_layers[i + 1]->input_layernorm->weight : m.norm->weight, eps);
        h = sum.sum;
        normed = sum.normed;
      } else {
        h = post.sum + fed;
      }
    }
  } else {
    for (int64_t i = 0; i < local_layers; ++i) {
      auto& layer = *m.decoder_layers[i];
      h = h + layer.self_attn->forward(layer.input_layernorm(h), cos, sin, mask_bias, &keys[i], &values[i], 0, 0,
                                       &access);
      moe::LayerIO io;
      if (record && layer.sparse) io.experts = &experts.emplace_back();
      h = h + layer.feed_forward(layer.post_attention_layernorm(h), io);
    }
  }
  if (record) {
    recorded_routing_.layers.clear();
    for (auto& e : experts) recorded_routing_.layers.push_back(e.reshape({b, 1, -1}));
  }
  if (access.kernels && pp_.last()) return normed;
  return pp_.last() ? m.norm(h) : h;
}

torch::Tensor CausalLMImpl::decode_paged_on_device(const torch::Tensor& input_ids, const torch::Tensor& tables,
                                                   const torch::Tensor& lengths, int64_t span,
                                                   const RotaryFrequencies& rotary, PagedKVCache& cache) {
  const int64_t b = input_ids.size(0);
  auto h = layers_->model->embed(input_ids);
  const int64_t kv = cache.keys.empty() ? 0 : cache.keys[0].size(1);
  const bool kernels_apply = decode_kernels_apply(h, cache.keys, cache.values, config_, *layers_->model,
                                                  !tp_.enabled() && !lora_branches_active());
  // The fused kernels read the tables as [rows, head_dim], made by one kernel; the operators' layout otherwise.
  torch::Tensor cos, sin;
  if (kernels_apply) {
    auto tables_of_rows = kernels::rotary_tables(lengths, rotary.inv_freq, rotary.attention_scaling, h.scalar_type());
    cos = tables_of_rows.cos;
    sin = tables_of_rows.sin;
  } else {
    std::tie(cos, sin) = rotary_cos_sin(lengths.view({b, 1}), rotary, h.scalar_type());
  }
  SlotAccess access = decode_step_access(tables, lengths, cache.block_size(), span, kv, /*paged=*/true, kernels_apply);
  access.sliding_window = config_.sliding_window;
  const auto mask_bias =
      kernels_apply ? torch::Tensor() : decode_step_mask_bias(lengths, span, config_.sliding_window, h.scalar_type());
  return decode_layers(h, cos, sin, mask_bias, access, cache.keys, cache.values);
}

bool CausalLMImpl::decodes_on_device() const {
  return !tp_.enabled() && !pp_.enabled() && config_.num_moe_layers() == 0 && !lora_branches_active() &&
         config_.rope_scaling.type != "dynamic" && !batch_invariant_active() &&
         router_replay_ == RouterReplayMode::kOff && !keep_router_logits_;
}

bool CausalLMImpl::decode_attends_row_lengths(const PagedKVCache& cache) const {
  torch::NoGradGuard no_grad;
  // decode_paged_on_device asks about its embedded rows: their dtype and device are the embedding's.
  const auto rows = torch::empty({0}, layers_->model->embed_tokens->weight.options());
  return decodes_on_device() && decode_kernels_apply(rows, cache.keys, cache.values, config_, *layers_->model,
                                                     !tp_.enabled() && !lora_branches_active());
}

void CausalLMImpl::check_batch_invariant(const char* what) const {
  HF_CHECK(!tp_.enabled(), "actor_rollout_ref.rollout.batch_invariant: ", what, " under tensor parallelism (size ",
           tp_.size(), ") sums partial products across ranks; the mode needs one rank");
  HF_CHECK(config_.num_moe_layers() == 0, "actor_rollout_ref.rollout.batch_invariant: ", config_.model_type,
           " layers route over experts, which the batch-invariant kernels do not cover");
  HF_CHECK(!lora_branches_active(), "actor_rollout_ref.rollout.batch_invariant: unmerged LoRA adapters (merge them, ",
           "rollout.lora_merge, or disable them) are not covered by the batch-invariant kernels");
}

torch::Tensor CausalLMImpl::batch_invariant_layers(const torch::Tensor& h, const batch_invariant::Tokens& tokens,
                                                   std::vector<torch::Tensor>& keys, std::vector<torch::Tensor>& values,
                                                   const fused_decode::BlockTables& tables) {
  check_batch_invariant("the decoder");
  auto& m = *layers_->model;
  const int64_t local_layers = layer_range_.length;
  const auto weights = kernel_layer_weights(layers_->model, local_layers);
  const fused_decode::Shape shape = kernel_shape(config_);
  // A copy: the layers update it in place, and h may be the embedding's output or a caller's stage input.
  auto flat = h.reshape({-1, config_.hidden_size}).contiguous().clone();
  batch_invariant::check_supported(flat, shape, weights);
  for (int64_t i = 0; i < local_layers; ++i)
    HF_CHECK(keys[i].is_contiguous() && values[i].is_contiguous() && keys[i].scalar_type() == torch::kFloat32 &&
                 values[i].scalar_type() == torch::kFloat32,
             "actor_rollout_ref.rollout.batch_invariant: the KV cache must be contiguous float32");
  batch_invariant::forward_layers(flat, config_, shape, weights, keys, values, tables, tokens);
  auto out = flat.view(h.sizes());
  return pp_.last() ? batch_invariant::rms_norm(out, m.norm->weight, config_.rms_norm_eps).view(h.sizes()) : out;
}

torch::Tensor CausalLMImpl::batch_invariant_hidden_states(const torch::Tensor& h, const torch::Tensor& mask,
                                                          const torch::Tensor& positions, int64_t past,
                                                          KVCache* cache) {
  const int64_t b = h.size(0), t = h.size(1), total = past + t, local_layers = layer_range_.length;
  const int64_t kv = config_.num_key_value_heads, d = config_.head_dim();
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(h.device());
  std::vector<torch::Tensor> keys(static_cast<size_t>(local_layers)), values(static_cast<size_t>(local_layers));
  if (cache != nullptr) {
    // The slabs as the ordinary path keeps them ([b, kv, room, d], past positions first), grown the same way.
    auto ensure = [&](torch::Tensor& slab) {
      if (slab.defined() && slab.size(2) >= total && slab.is_contiguous()) return;
      const int64_t room = std::max({cache->capacity, total, slab.defined() ? 2 * slab.size(2) : int64_t{0}});
      auto grown = torch::empty({b, kv, room, d}, f32);
      if (past > 0) grown.narrow(2, 0, past).copy_(slab.narrow(2, 0, past));
      slab = grown;
    };
    for (int64_t i = 0; i < local_layers; ++i) {
      ensure(cache->keys[i]);
      ensure(cache->values[i]);
      keys[i] = cache->keys[i];
      values[i] = cache->values[i];
    }
  } else {
    // Without a cache each layer writes every token's key and value before any query reads them: one scratch
    // pair serves all layers.
    auto scratch_k = torch::empty({b, kv, total, d}, f32), scratch_v = torch::empty({b, kv, total, d}, f32);
    std::fill(keys.begin(), keys.end(), scratch_k);
    std::fill(values.begin(), values.end(), scratch_v);
  }
  batch_invariant::Tokens tokens;
  const auto pos = positions.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t* pp = pos.data_ptr<int64_t>();
  for (int64_t r = 0; r < b; ++r)
    for (int64_t i = 0; i < t; ++i) {
      tokens.row.push_back(r);
      tokens.slot.push_back(past + i);
      tokens.position.push_back(pp[r * t + i]);
    }
  const auto key_mask = mask.to(torch::kCPU, torch::kInt64).contiguous();
  tokens.key_mask = key_mask.data_ptr<int64_t>();
  tokens.key_mask_stride = total;
  std::vector<int64_t> rows(static_cast<size_t>(b));
  for (int64_t r = 0; r < b; ++r) rows[static_cast<size_t>(r)] = r;
  const int64_t room = local_layers > 0 ? keys[0].size(2) : 1;
  auto out = batch_invariant_layers(h, tokens, keys, values, {rows.data(), 1, room});
  if (cache != nullptr) cache->filled = total;
  return out;
}

torch::Tensor CausalLMImpl::stage_activation_like(int64_t batch, int64_t seq) const {
  const torch::Tensor any = parameters().front();  // a copy: parameters() returns a temporary
  // A sequence-parallel rank's stages pass its slice of the padded sequence.
  const int64_t rows = sp_.enabled() ? sequence_parallel_padded_length(seq, sp_.size()) / sp_.size() : seq;
  return torch::empty({batch, rows, config_.hidden_size}, any.options().requires_grad(false));
}

ForwardOutput CausalLMImpl::apply_head(const torch::Tensor& hidden) {
  HF_CHECK(pp_.last(), "CausalLM: pipeline stage ", pp_.stage, " of ", pp_.stages,
           " has no head; only the last stage computes logits or values");
  ForwardOutput out;
  if (head_ == HeadKind::kValue) {
    out.values = layers_->score(hidden).squeeze(-1).to(torch::kFloat32);
  } else {
    // Column-parallel over the vocabulary: each rank's logits for its slice.
    const torch::Tensor weight = lm_head_weight();
    // A decode step's few rows: libtorch's matrix multiply streams the weight on one core at a fraction of
    // the bandwidth (fused_decode.h); the result is the same product.
    const bool few_rows = hidden.dim() == 2 && hidden.size(0) <= fused_decode::kMaxVectorRows &&
                          !torch::GradMode::is_enabled() && hidden.device().is_cpu() &&
                          hidden.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32 &&
                          weight.dim() == 2 && weight.is_contiguous();
    if (batch_invariant_active()) {
      check_batch_invariant("the head");
      auto rows = batch_invariant::linear(hidden.reshape({-1, hidden.size(-1)}), weight);
      auto sizes = hidden.sizes().vec();
      sizes.back() = weight.size(0);
      out.logits = rows.view(sizes);
      return out;
    }
    if (few_rows) {
      out.logits = fused_decode::linear(hidden.contiguous(), weight);
    } else if (!torch::GradMode::is_enabled() && !tp_.enabled() && kernels::few_rows_linear_applies(hidden, {weight})) {
      // A decode step's head on the fused kernels' path (kernels/few_rows_linear.h): the logits as the matmul
      // rounds them, stored in float32 by the same kernel.
      out.logits = kernels::few_rows_linear(hidden, {weight}, {}, /*float_out=*/true)[0];
    } else {
      out.logits = torch::linear(copy_to_tensor_parallel(hidden, tp_), weight).to(torch::kFloat32);
    }
  }
  return out;
}

torch::Tensor CausalLMImpl::lm_head_weight() const {
  HF_CHECK(head_ == HeadKind::kLanguageModel && pp_.last(), "CausalLM: only the last pipeline stage of a language model ",
           "has an lm_head");
  return layers_->lm_head ? layers_->lm_head->weight : layers_->model->embed_tokens->weight;
}

torch::Tensor CausalLMImpl::full_vocab_logits(const torch::Tensor& hidden) {
  HF_CHECK(head_ == HeadKind::kLanguageModel, "full_vocab_logits: a value-head model has no logits");
  return gather_from_tensor_parallel(apply_head(hidden).logits, tp_);
}

void CausalLMImpl::add_lora(const LoraConfig& lora, uint64_t seed) {
  HF_CHECK(lora.enabled(), "lora_rank must be positive to add LoRA adapters, got ", lora.rank);
  HF_CHECK(!lora_added_, "CausalLM::add_lora: the model already has LoRA adapters");
  const auto targets = lora_target_paths(*this, lora);
  size_t next = 0;
  for_each_lora_projection(
      layers_->model, layer_range_,
      [&](int64_t ordinal, const std::string& path, torch::nn::Linear& base, std::shared_ptr<lora::Branch>& slot) {
        if (next == targets.size() || targets[next] != path) return;
        // One generator per projection, seeded from its ordinal: a projection's A does not depend on which
        // other projections are targeted or which pipeline stage holds it.
        auto generator = at::make_generator<at::CPUGeneratorImpl>(
            seed ^ (0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(ordinal + 1)));
        slot = lora::attach_branch(base, lora.rank, lora.alpha, generator,
                                   shard_dim(path + ".weight", config_, tp_.size()), tp_);
        ++next;
      });
  HF_CHECK(next == targets.size(), "CausalLM::add_lora: target ", targets[next], " is not a projection of this model");
  for (auto& item : named_parameters()) item.value().requires_grad_(is_lora_parameter_name(item.key()));
  lora_ = lora;
  lora_added_ = true;
  lora_enabled_ = true;
}

void CausalLMImpl::set_lora_enabled(bool enabled) {
  HF_CHECK(lora_added_, "CausalLM::set_lora_enabled: the model has no LoRA adapters");
  HF_CHECK(!lora_merged_, "CausalLM::set_lora_enabled: the adapters are merged into the weights; unmerge first");
  for_each_lora_projection(layers_->model, layer_range_,
                           [&](int64_t, const std::string&, torch::nn::Linear&, std::shared_ptr<lora::Branch>& slot) {
                             if (slot) slot->enabled = enabled;
                           });
  lora_enabled_ = enabled;
}

void CausalLMImpl::merge_lora() {
  HF_CHECK(lora_added_ && lora_enabled_, "CausalLM::merge_lora: the model has no enabled LoRA adapters");
  HF_CHECK(!lora_merged_, "CausalLM::merge_lora: the adapters are already merged");
  for_each_lora_projection(layers_->model, layer_range_,
                           [](int64_t, const std::string&, torch::nn::Linear& base, std::shared_ptr<lora::Branch>& slot) {
                             if (slot) slot->merge(base);
                           });
  lora_merged_ = true;
}

void CausalLMImpl::unmerge_lora() {
  HF_CHECK(lora_merged_, "CausalLM::unmerge_lora: the adapters are not merged");
  for_each_lora_projection(layers_->model, layer_range_,
                           [](int64_t, const std::string&, torch::nn::Linear& base, std::shared_ptr<lora::Branch>& slot) {
                             if (slot) slot->unmerge(base);
                           });
  lora_merged_ = false;
}

}  // namespace hybridflow
