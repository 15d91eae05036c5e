// The batch-invariant CUDA kernels' checks and launches (kernels/batch_invariant_kernels.h); the kernels
// themselves are in batch_invariant_kernels.cu. A build without CUDA compiles the checks and throws.
#include "hybridflow/kernels/batch_invariant_kernels.h"

#include <initializer_list>

#include "hybridflow/core/error.h"

#ifdef HF_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "kernels/batch_invariant_launch.h"
#endif

namespace hybridflow::kernels::batch_invariant {
namespace {

constexpr const char* kInvariantKey = "actor_rollout_ref.rollout.batch_invariant";

// The first operand decides the device: a CUDA tensor in a CUDA build, float32 and contiguous; the others
// (undefined ones are optional operands) must match it.
void bik_check_operands(const char* what, const torch::Tensor& first, std::initializer_list<torch::Tensor> rest) {
  HF_CHECK(first.defined() && first.is_cuda(), kInvariantKey, ": the CUDA kernel ", what,
           " takes CUDA tensors; got ", first.defined() ? first.device().str() : "an undefined tensor",
           " (the CPU tensors take the CPU kernels of model/batch_invariant.h)");
#ifndef HF_WITH_CUDA
  HF_FAIL(kInvariantKey, ": the CUDA kernel ", what, " needs a build with CUDA kernels (HF_CUDA=1)");
#endif
  auto check = [&](const torch::Tensor& t) {
    if (!t.defined()) return;
    HF_CHECK(t.scalar_type() == torch::kFloat32 && t.device() == first.device() && t.is_contiguous(), kInvariantKey,
             ": the CUDA kernel ", what, " takes contiguous float32 tensors on ", first.device(), "; got ",
             t.sizes(), " ", t.scalar_type(), " on ", t.device(), t.is_contiguous() ? "" : " (not contiguous)");
  };
  check(first);
  for (const auto& t : rest) check(t);
}

void bik_check_places(const Places& p, const torch::Tensor& like, int64_t tokens) {
  for (const torch::Tensor* t : {&p.rows, &p.slots, &p.tables})
    HF_CHECK(t->defined() && t->scalar_type() == torch::kInt64 && t->device() == like.device() && t->is_contiguous(),
             kInvariantKey, ": token places must be contiguous int64 tensors on ", like.device());
  HF_CHECK(p.rows.dim() == 1 && p.rows.size(0) == tokens && p.slots.sizes() == p.rows.sizes() &&
               p.tables.dim() == 2 && p.tables.size(1) > 0 && p.block_size > 0,
           kInvariantKey, ": expected rows and slots [", tokens, "] and tables [table rows, width], got ",
           p.rows.sizes(), ", ", p.slots.sizes(), ", ", p.tables.sizes(), " (block size ", p.block_size, ")");
}

// Pools [blocks, kv_heads, block_size, dim] of the places' block size.
void bik_check_pools(const torch::Tensor& keys, const torch::Tensor& values, const Places& p, int64_t kv_heads,
                     int64_t dim) {
  HF_CHECK(keys.dim() == 4 && keys.size(1) == kv_heads && keys.size(2) == p.block_size && keys.size(3) == dim &&
               values.sizes() == keys.sizes(),
           kInvariantKey, ": expected key and value pools [blocks, ", kv_heads, ", ", p.block_size, ", ", dim,
           "], got ", keys.sizes(), " and ", values.sizes());
}

void bik_check_heads(int64_t heads, int64_t kv_heads, int64_t dim) {
  HF_CHECK(kv_heads > 0 && heads % kv_heads == 0 && dim >= 2 && dim % 2 == 0 && dim <= 256, kInvariantKey,
           ": the CUDA attention takes query heads a multiple of the KV heads and an even head_dim of at most ",
           "256; got ", heads, " heads over ", kv_heads, " of ", dim);
}

#ifdef HF_WITH_CUDA
void* bik_stream(const torch::Tensor& t) { return at::cuda::getCurrentCUDAStream(t.device().index()).stream(); }
void bik_launched(const char* what, const char* error) {
  HF_CHECK(error == nullptr, kInvariantKey, ": the CUDA kernel ", what, " failed to launch: ", error);
}
cuda::invariant::TokenPlaces bik_places(const Places& p) {
  return {p.rows.data_ptr<int64_t>(), p.slots.data_ptr<int64_t>(), p.tables.data_ptr<int64_t>(), p.rows.size(0),
          p.tables.size(1), p.block_size};
}
const float* bik_data(const torch::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }
#endif

}  // namespace

bool built() {
#ifdef HF_WITH_CUDA
  return true;
#else
  return false;
#endif
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias) {
  bik_check_operands("linear", x, {w, bias});
  HF_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1) && (!bias.defined() || bias.numel() == w.size(0)) &&
               x.size(0) < int64_t{65535} * 64,
           kInvariantKey, ": linear takes x [rows, in] (rows < 4194240), w [out, in] and bias [out]; got ", x.sizes(),
           ", ", w.sizes(), bias.defined() ? ", " : "", bias.defined() ? bias.sizes() : w.sizes().slice(0, 0));
  auto y = torch::empty({x.size(0), w.size(0)}, x.options());
#ifdef HF_WITH_CUDA
  const c10::cuda::CUDAGuard guard(x.device());
  bik_launched("linear", cuda::invariant::linear(x.data_ptr<float>(), w.data_ptr<float>(), bik_data(bias),
                                                 y.data_ptr<float>(), x.size(0), x.size(1), w.size(0), bik_stream(x)));
#endif
  return y;
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  bik_check_operands("rms_norm", x, {weight});
  HF_CHECK(x.dim() == 2 && weight.dim() == 1 && weight.size(0) == x.size(1), kInvariantKey,
           ": rms_norm takes x [rows, n] and weight [n]; got ", x.sizes(), " and ", weight.sizes());
  auto out = torch::empty_like(x);
#ifdef HF_WITH_CUDA
  const c10::cuda::CUDAGuard guard(x.device());
  bik_launched("rms_norm", cuda::invariant::rms_norm(x.data_ptr<float>(), weight.data_ptr<float>(),
                                                     out.data_ptr<float>(), x.size(0), x.size(1),
                                                     static_cast<float>(eps), bik_stream(x)));
#else
  (void)eps;
#endif
  return out;
}

void swiglu_(torch::Tensor& gate, const torch::Tensor& up) {
  bik_check_operands("swiglu", gate, {up});
  HF_CHECK(gate.sizes() == up.sizes(), kInvariantKey, ": swiglu takes gate and up of one shape; got ", gate.sizes(),
           " and ", up.sizes());
#ifdef HF_WITH_CUDA
  const c10::cuda::CUDAGuard guard(gate.device());
  bik_launched("swiglu", cuda::invariant::swiglu(gate.data_ptr<float>(), up.data_ptr<float>(), gate.numel(),
                                                 bik_stream(gate)));
#endif
}

void heads_into_cache(const HeadsIntoCache& a, const Places& places) {
  bik_check_operands("heads_into_cache", a.q, {a.k, a.v, a.q_norm, a.k_norm, a.cos, a.sin, a.key_pool, a.value_pool});
  const int64_t dim = a.cos.defined() && a.cos.dim() == 2 ? a.cos.size(1) : 0, tokens = a.q.size(0);
  bik_check_heads(a.heads, a.kv_heads, dim);
  HF_CHECK(a.q.dim() == 2 && a.q.size(1) == a.heads * dim && a.k.dim() == 2 && a.k.size(0) == tokens &&
               a.k.size(1) == a.kv_heads * dim && a.v.sizes() == a.k.sizes() && a.cos.size(0) == tokens &&
               a.sin.sizes() == a.cos.sizes() && (!a.q_norm.defined() || a.q_norm.numel() == dim) &&
               (!a.k_norm.defined() || a.k_norm.numel() == dim),
           kInvariantKey, ": heads_into_cache: expected q [tokens, heads x dim], k and v [tokens, kv_heads x dim], ",
           "cos and sin [tokens, dim]; got ", a.q.sizes(), ", ", a.k.sizes(), ", ", a.v.sizes(), ", ", a.cos.sizes());
  bik_check_places(places, a.q, tokens);
  bik_check_pools(a.key_pool, a.value_pool, places, a.kv_heads, dim);
#ifdef HF_WITH_CUDA
  const c10::cuda::CUDAGuard guard(a.q.device());
  cuda::invariant::HeadsIntoCache args{a.q.data_ptr<float>(), a.k.data_ptr<float>(), a.v.data_ptr<float>(),
                                       bik_data(a.q_norm), bik_data(a.k_norm), a.cos.data_ptr<float>(),
                                       a.sin.data_ptr<float>(), a.key_pool.data_ptr<float>(),
                                       a.value_pool.data_ptr<float>(), bik_places(places), a.heads, a.kv_heads, dim,
                                       static_cast<float>(a.eps)};
  bik_launched("heads_into_cache", cuda::invariant::heads_into_cache(args, bik_stream(a.q)));
#endif
}

torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& key_pool, const torch::Tensor& value_pool,
                        const Places& places, const torch::Tensor& key_mask, int64_t heads, int64_t sliding_window,
                        double scale) {
  bik_check_operands("attention", q, {key_pool, value_pool});
  HF_CHECK(q.dim() == 2 && key_pool.dim() == 4 && heads > 0 && q.size(1) % heads == 0, kInvariantKey,
           ": attention takes q [tokens, heads x dim] and pools [blocks, kv_heads, block_size, dim]; got ", q.sizes(),
           " (", heads, " heads) and ", key_pool.sizes());
  const int64_t dim = q.size(1) / heads, kv_heads = key_pool.size(1);
  bik_check_heads(heads, kv_heads, dim);
  bik_check_places(places, q, q.size(0));
  bik_check_pools(key_pool, value_pool, places, kv_heads, dim);
  HF_CHECK(!key_mask.defined() || (key_mask.dim() == 2 && key_mask.scalar_type() == torch::kInt64 &&
                                   key_mask.device() == q.device() && key_mask.is_contiguous()),
           kInvariantKey, ": attention's key mask must be a contiguous int64 [table rows, keys] tensor on ", q.device());
  auto out = torch::empty_like(q);
#ifdef HF_WITH_CUDA
  const c10::cuda::CUDAGuard guard(q.device());
  cuda::invariant::Attention args{q.data_ptr<float>(), key_pool.data_ptr<float>(), value_pool.data_ptr<float>(),
                                  key_mask.defined() ? key_mask.data_ptr<int64_t>() : nullptr, out.data_ptr<float>(),
                                  bik_places(places), heads, kv_heads, dim, sliding_window,
                                  key_mask.defined() ? key_mask.size(1) : 0, static_cast<float>(scale)};
  bik_launched("attention", cuda::invariant::attention(args, bik_stream(q)));
#else
  (void)sliding_window;
  (void)scale;
#endif
  return out;
}

std::pair<torch::Tensor, torch::Tensor> token_log_probs(const torch::Tensor& logits, const torch::Tensor& targets,
                                                        double temperature, bool with_entropy) {
  bik_check_operands("token_log_probs", logits, {});
  HF_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0) && temperature > 0,
           kInvariantKey, ": log-probs take logits [rows, vocab], targets [rows] and a temperature > 0; got ",
           logits.sizes(), ", ", targets.sizes(), ", ", temperature);
  const auto ids = targets.to(logits.device(), torch::kInt64).contiguous();
  const int64_t vocab = logits.size(1);
  // One host synchronisation a call: an id outside the vocabulary would read past its row.
  if (ids.numel() > 0) {
    const auto range = torch::stack({ids.min(), ids.max()}).cpu();
    const int64_t low = range[0].item<int64_t>(), high = range[1].item<int64_t>();
    HF_CHECK(low >= 0 && high < vocab, kInvariantKey, ": target ", low < 0 ? low : high,
             " outside the vocabulary [0, ", vocab, ")");
  }
  auto log_probs = torch::empty({logits.size(0)}, logits.options());
  auto entropy = with_entropy ? torch::empty({logits.size(0)}, logits.options()) : torch::Tensor();
#ifdef HF_WITH_CUDA
  const c10::cuda::CUDAGuard guard(logits.device());
  float* entropy_out = with_entropy ? entropy.data_ptr<float>() : nullptr;
  bik_launched("token_log_probs",
               cuda::invariant::token_log_probs(logits.data_ptr<float>(), ids.data_ptr<int64_t>(),
                                                log_probs.data_ptr<float>(), entropy_out, logits.size(0), vocab,
                                                static_cast<float>(temperature), bik_stream(logits)));
#endif
  return {log_probs, entropy};
}

}  // namespace hybridflow::kernels::batch_invariant
