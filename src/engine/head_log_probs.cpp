#include "hybridflow/engine/head_log_probs.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "hybridflow/core/error.h"
#include "hybridflow/model/batch_invariant.h"

namespace hybridflow {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Rows [begin, begin + n) of the logits, as model_log_probs computed them: the head in the weight's dtype,
// then float32, then divided by the temperature.
torch::Tensor chunk_logits(const torch::Tensor& hidden, const torch::Tensor& weight, int64_t begin, int64_t n,
                           double temperature) {
  torch::Tensor z = torch::linear(hidden.narrow(0, begin, n), weight).to(torch::kFloat32);
  return temperature != 1.0 ? z.div_(temperature) : z;
}

// Where a target falls in this rank's vocabulary slice: its local index (clamped, so gathers stay in range)
// and whether it is this rank's at all.
struct LocalTargets {
  torch::Tensor index;  // [N]
  torch::Tensor mine;   // [N] bool
};
LocalTargets local_targets(const torch::Tensor& targets, int64_t width, int rank) {
  torch::Tensor local = targets - static_cast<int64_t>(rank) * width;
  return {local.clamp(0, width - 1), local.ge(0).logical_and(local.lt(width))};
}

struct ChunkedHeadLogProbs : torch::autograd::Function<ChunkedHeadLogProbs> {
  // hidden [N, H], weight [V / t, H], targets [N] int64. Returns {log_probs [N], entropy [N], sum_pi_squared
  // [N]} (entropy zeros and not differentiable without with_entropy; sum_pi_squared, never differentiable,
  // undefined without with_sum_pi_squared). comm: the tensor-parallel group, or null for one process.
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& hidden, const torch::Tensor& weight,
                               const torch::Tensor& targets, double temperature, bool with_entropy, int64_t chunk,
                               Communicator* comm, bool with_sum_pi_squared) {
    const int64_t n = hidden.size(0), width = weight.size(0);
    const auto f32 = hidden.options().dtype(torch::kFloat32);
    const LocalTargets t = local_targets(targets, width, comm != nullptr ? comm->rank() : 0);
    // Per token, over this rank's slice: the max logit m, sum exp(z - m), sum exp(z - m) (z - m), z[target].
    torch::Tensor local_max = torch::empty({n}, f32), sum_exp = torch::empty({n}, f32);
    torch::Tensor weighted = torch::zeros({n}, f32), picked = torch::empty({n}, f32);
    // The optimal token baseline's sum of p^2 from the same logits: sum exp(2 (z - m)), rescaled like sum_exp.
    torch::Tensor squares = with_sum_pi_squared ? torch::empty({n}, f32) : torch::Tensor();
    for (int64_t begin = 0; begin < n; begin += chunk) {
      const int64_t len = std::min(chunk, n - begin);
      // Two [chunk, V] buffers at a time: the logits (shifted in place) and their exponentials.
      torch::Tensor z = chunk_logits(hidden, weight, begin, len, temperature);
      picked.narrow(0, begin, len).copy_(z.gather(-1, t.index.narrow(0, begin, len).unsqueeze(-1)).squeeze(-1));
      torch::Tensor m = std::get<0>(z.max(-1, /*keepdim=*/true));
      torch::Tensor& shifted = z.sub_(m);
      torch::Tensor e = shifted.exp();
      local_max.narrow(0, begin, len).copy_(m.squeeze(-1));
      sum_exp.narrow(0, begin, len).copy_(e.sum(-1));
      if (with_sum_pi_squared) squares.narrow(0, begin, len).copy_((with_entropy ? e * e : e.mul_(e)).sum(-1));
      if (with_entropy) weighted.narrow(0, begin, len).copy_(e.mul_(shifted).sum(-1));
    }
    picked = torch::where(t.mine, picked, torch::zeros_like(picked));
    // The ranks' sums rescaled to the global max M: sum exp(z - M) = exp(m - M) s, and
    // sum exp(z - M) (z - M) = exp(m - M) (w + (m - M) s). Two all-reduces for all chunks together.
    torch::Tensor global_max = local_max;
    if (comm != nullptr) {
      global_max = local_max.clone();
      comm->all_reduce(global_max, ReduceOp::kMax);
      torch::Tensor gap = local_max - global_max;
      torch::Tensor scale = gap.exp();
      std::vector<torch::Tensor> rows = {sum_exp * scale, scale * (weighted + gap * sum_exp), picked};
      if (with_sum_pi_squared) rows.push_back(squares * scale * scale);
      torch::Tensor stacked = torch::stack(rows).contiguous();
      comm->all_reduce(stacked, ReduceOp::kSum);
      sum_exp = stacked[0];
      weighted = stacked[1];
      picked = stacked[2];
      if (with_sum_pi_squared) squares = stacked[3];
    }
    // log p(target) = (z_t - M) - log S, as log_softmax computes it; H = log S - sum p (z - M).
    torch::Tensor log_s = sum_exp.log();
    torch::Tensor log_probs = (picked - global_max) - log_s;
    torch::Tensor entropy = with_entropy ? log_s - weighted / sum_exp : torch::zeros({n}, f32);
    torch::Tensor lse = global_max + log_s;
    ctx->save_for_backward({hidden, weight, targets, lse, entropy});
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["with_entropy"] = with_entropy;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["rank"] = static_cast<int64_t>(comm != nullptr ? comm->rank() : 0);
    torch::Tensor sum_pi_squared = with_sum_pi_squared ? squares / (sum_exp * sum_exp) : torch::zeros({n}, f32);
    ctx->mark_non_differentiable(with_entropy ? variable_list{sum_pi_squared} : variable_list{entropy, sum_pi_squared});
    ctx->set_materialize_grads(false);  // an unused output's gradient stays undefined: no work for it
    return {log_probs, entropy, sum_pi_squared};
  }

  // d log p(y) / dz = onehot(y) - p; d H / dz = -p (log p + H). Each chunk's logits are recomputed.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &hidden = saved[0], &weight = saved[1], &targets = saved[2], &lse = saved[3], &entropy = saved[4];
    const double temperature = ctx->saved_data["temperature"].toDouble();
    const bool with_entropy = ctx->saved_data["with_entropy"].toBool();
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const torch::Tensor& g_lp = grads[0];
    const torch::Tensor g_h = with_entropy ? grads[1] : torch::Tensor();
    const bool want_hidden = ctx->needs_input_grad(0), want_weight = ctx->needs_input_grad(1);
    variable_list out(8);
    if ((!g_lp.defined() && !g_h.defined()) || (!want_hidden && !want_weight)) return out;
    const int64_t n = hidden.size(0), width = weight.size(0);
    const LocalTargets t = local_targets(targets, width, static_cast<int>(ctx->saved_data["rank"].toInt()));
    torch::Tensor grad_hidden = want_hidden ? torch::empty_like(hidden) : torch::Tensor();
    // The weight's gradient is one [V, H] matmul per group of tokens, not per chunk: a chunk of a 150k
    // vocabulary is ~55 tokens, and a matmul that short costs mostly the writing of its [V, H] result (in bf16
    // also its conversion to float32 and the addition), which per chunk was several times the whole head's
    // forward. A group of up to H tokens keeps its logits' gradients in a buffer no larger than the weight.
    const int64_t group = want_weight ? chunk * std::max<int64_t>(1, hidden.size(1) / chunk) : chunk;
    const bool low_precision = weight.scalar_type() != torch::kFloat32;
    // Several groups sum in float32 (one matmul over all tokens would accumulate so); one group is that
    // matmul already (no tokens: zeros).
    torch::Tensor grad_weight;
    if (want_weight && (n > group || n == 0))
      grad_weight = torch::zeros(weight.sizes(), weight.options().dtype(torch::kFloat32));
    for (int64_t group_begin = 0; group_begin < n; group_begin += group) {
      const int64_t group_len = std::min(group, n - group_begin);
      torch::Tensor group_logits;  // [group_len, V] in the weight's dtype: the group's d loss / d logits
      if (want_weight) group_logits = torch::empty({group_len, width}, weight.options());
      for (int64_t begin = group_begin; begin < group_begin + group_len; begin += chunk) {
        const int64_t len = std::min(chunk, group_begin + group_len - begin);
        // gz = -p (g_lp + g_H (log p + H)) + onehot(target) g_lp, built in place in two [chunk, V] buffers.
        torch::Tensor log_p =
            chunk_logits(hidden, weight, begin, len, temperature).sub_(lse.narrow(0, begin, len).unsqueeze(-1));
        torch::Tensor gz = log_p.exp();
        torch::Tensor coef;  // [chunk, V] or [chunk, 1]
        if (g_h.defined()) {
          coef = log_p.add_(entropy.narrow(0, begin, len).unsqueeze(-1)).mul_(g_h.narrow(0, begin, len).unsqueeze(-1));
          if (g_lp.defined()) coef.add_(g_lp.narrow(0, begin, len).unsqueeze(-1));
        } else {
          coef = g_lp.narrow(0, begin, len).unsqueeze(-1);
        }
        gz.mul_(coef).neg_();
        if (g_lp.defined()) {
          torch::Tensor g = g_lp.narrow(0, begin, len);
          torch::Tensor at_target = torch::where(t.mine.narrow(0, begin, len), g, torch::zeros_like(g));
          gz.scatter_add_(-1, t.index.narrow(0, begin, len).unsqueeze(-1), at_target.unsqueeze(-1));
        }
        if (temperature != 1.0) gz.div_(temperature);
        torch::Tensor g_logits = gz.to(weight.scalar_type());
        if (want_hidden) grad_hidden.narrow(0, begin, len).copy_(g_logits.mm(weight));
        if (want_weight) group_logits.narrow(0, begin - group_begin, len).copy_(g_logits);
      }
      if (!want_weight) continue;
      const torch::Tensor h = hidden.narrow(0, group_begin, group_len);
      if (!grad_weight.defined())
        grad_weight = group_logits.t().mm(h);  // the only group
      else if (low_precision)
        grad_weight.add_(group_logits.t().mm(h).to(torch::kFloat32));
      else
        grad_weight.addmm_(group_logits.t(), h);  // no [V, H] temporary
    }
    out[0] = grad_hidden;
    if (want_weight) out[1] = grad_weight.to(weight.scalar_type());  // a no-op for one group
    return out;
  }
};

// Batch-invariant mode (model/batch_invariant.h; gradients off): each token's logits and log-softmax from the
// fixed-order kernels, as generation records them, a chunk of tokens at a time.
TokenLogProbs batch_invariant_head_log_probs(const torch::Tensor& hidden, const torch::Tensor& weight,
                                             const torch::Tensor& targets, double temperature, bool with_entropy,
                                             const TensorParallelGroup& tp, int64_t chunk) {
  HF_CHECK(!tp.enabled(), "actor_rollout_ref.rollout.batch_invariant: log-probs under tensor parallelism (size ",
           tp.size(), ") combine the ranks' partial sums; the mode needs one rank");
  const torch::Tensor flat = hidden.reshape({-1, hidden.size(-1)});
  const torch::Tensor ids = targets.reshape({-1}).to(torch::kLong);
  const int64_t n = flat.size(0);
  TokenLogProbs result;
  // On the hidden states' device: CUDA tensors take the CUDA kernels, and their chunks stay there.
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(flat.device());
  result.log_probs = torch::empty({n}, f32);
  if (with_entropy) result.entropy = torch::empty({n}, f32);
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t len = std::min(chunk, n - begin);
    const auto logits = batch_invariant::linear(flat.narrow(0, begin, len), weight);
    const auto part = batch_invariant::token_log_probs(logits, ids.narrow(0, begin, len), temperature, with_entropy);
    result.log_probs.narrow(0, begin, len).copy_(part.log_probs);
    if (with_entropy) result.entropy.narrow(0, begin, len).copy_(part.entropy);
  }
  result.log_probs = result.log_probs.view(targets.sizes()).to(hidden.device());
  if (with_entropy) result.entropy = result.entropy.view(targets.sizes()).to(hidden.device());
  return result;
}

}  // namespace

int64_t head_chunk_tokens(int64_t local_vocab, torch::DeviceType device) {
  HF_CHECK(local_vocab > 0, "head_chunk_tokens: vocabulary must be > 0, got ", local_vocab);
  const int64_t bytes = device == torch::kCUDA ? kHeadChunkBytesCuda : kHeadChunkBytes;
  return std::max<int64_t>(1, bytes / (4 * local_vocab));
}

torch::Tensor head_sum_pi_squared(const torch::Tensor& hidden, const torch::Tensor& weight, double temperature,
                                  const TensorParallelGroup& tp, int64_t chunk_tokens) {
  HF_CHECK(weight.dim() == 2 && hidden.dim() >= 1 && hidden.size(-1) == weight.size(1),
           "head_sum_pi_squared: hidden ", hidden.sizes(), " does not match the head's weight ", weight.sizes());
  HF_CHECK(temperature > 0, "head_sum_pi_squared: temperature must be > 0, got ", temperature);
  torch::NoGradGuard no_grad;
  const int64_t chunk = chunk_tokens > 0 ? chunk_tokens : head_chunk_tokens(weight.size(0), hidden.device().type());
  const torch::Tensor flat = hidden.reshape({-1, hidden.size(-1)}).contiguous();
  const int64_t n = flat.size(0);
  const auto f32 = flat.options().dtype(torch::kFloat32);
  // Per token, over this rank's slice: the max logit m, s1 = sum exp(z - m) and s2 = sum exp(2 (z - m)); then
  // sum p^2 = S2 / S1^2 with both sums rescaled to the ranks' common max M.
  torch::Tensor local_max = torch::empty({n}, f32), s1 = torch::empty({n}, f32), s2 = torch::empty({n}, f32);
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t len = std::min(chunk, n - begin);
    torch::Tensor z = chunk_logits(flat, weight, begin, len, temperature);
    torch::Tensor m = std::get<0>(z.max(-1, /*keepdim=*/true));
    torch::Tensor e = z.sub_(m).exp_();
    local_max.narrow(0, begin, len).copy_(m.squeeze(-1));
    s1.narrow(0, begin, len).copy_(e.sum(-1));
    s2.narrow(0, begin, len).copy_(e.mul_(e).sum(-1));
  }
  if (tp.enabled()) {
    torch::Tensor global_max = local_max.clone();
    tp.comm()->all_reduce(global_max, ReduceOp::kMax);
    torch::Tensor scale = (local_max - global_max).exp();
    torch::Tensor stacked = torch::stack({s1 * scale, s2 * scale * scale}).contiguous();
    tp.comm()->all_reduce(stacked, ReduceOp::kSum);
    s1 = stacked[0];
    s2 = stacked[1];
  }
  return (s2 / (s1 * s1)).view(hidden.sizes().slice(0, hidden.dim() - 1));
}

TokenLogProbs head_log_probs(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets,
                             double temperature, bool with_entropy, const TensorParallelGroup& tp, int64_t chunk_tokens,
                             bool with_sum_pi_squared) {
  HF_CHECK(weight.dim() == 2 && hidden.dim() >= 1 && hidden.size(-1) == weight.size(1),
           "head_log_probs: hidden ", hidden.sizes(), " does not match the head's weight ", weight.sizes());
  HF_CHECK(targets.sizes() == hidden.sizes().slice(0, hidden.dim() - 1), "head_log_probs: targets ",
           targets.sizes(), " do not match hidden states ", hidden.sizes());
  HF_CHECK(temperature > 0, "head_log_probs: temperature must be > 0, got ", temperature);
  const int64_t chunk = chunk_tokens > 0 ? chunk_tokens : head_chunk_tokens(weight.size(0), hidden.device().type());
  if (batch_invariant_active()) {
    TokenLogProbs fixed = batch_invariant_head_log_probs(hidden, weight, targets, temperature, with_entropy, tp, chunk);
    if (with_sum_pi_squared) fixed.sum_pi_squared = head_sum_pi_squared(hidden, weight, temperature, tp, chunk);
    return fixed;
  }
  // Enters the vocabulary-parallel region like the model's head: the hidden states' gradient is the sum of
  // every rank's part.
  torch::Tensor flat = copy_to_tensor_parallel(hidden, tp).reshape({-1, hidden.size(-1)}).contiguous();
  variable_list out = ChunkedHeadLogProbs::apply(flat, weight, targets.reshape({-1}).to(torch::kLong).contiguous(),
                                                 temperature, with_entropy, chunk,
                                                 tp.enabled() ? tp.comm() : static_cast<Communicator*>(nullptr),
                                                 with_sum_pi_squared);
  TokenLogProbs result;
  result.log_probs = out[0].view(targets.sizes());
  if (with_entropy) result.entropy = out[1].view(targets.sizes());
  if (with_sum_pi_squared) result.sum_pi_squared = out[2].view(targets.sizes());
  return result;
}

}  // namespace hybridflow
