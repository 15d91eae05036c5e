#include "hybridflow/engine/fused_adamw.h"

#include <ATen/Parallel.h>

#include <cmath>

#ifdef __SSE2__
#include <immintrin.h>
#endif

#include "hybridflow/core/error.h"

namespace hybridflow {
namespace {

// The step's constants, rounded to float32 once (as libtorch's kernels round a double scalar).
struct AdamWConstants {
  bool decay = false;
  float keep = 1;            // 1 - lr * weight_decay
  float beta1 = 0, one_minus_beta1 = 0, beta2 = 0, one_minus_beta2 = 0;
  float sqrt_correction2 = 1;  // sqrt(1 - beta2^t)
  float eps = 0;
  float neg_step_size = 0;   // -lr / (1 - beta1^t)
};

AdamWConstants adamw_constants(const torch::optim::AdamWOptions& o, int64_t step) {
  const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
  AdamWConstants c;
  c.decay = o.weight_decay() != 0;
  c.keep = static_cast<float>(1 - o.lr() * o.weight_decay());
  c.beta1 = static_cast<float>(beta1);
  c.one_minus_beta1 = static_cast<float>(1 - beta1);
  c.beta2 = static_cast<float>(beta2);
  c.one_minus_beta2 = static_cast<float>(1 - beta2);
  c.sqrt_correction2 = static_cast<float>(std::sqrt(1 - std::pow(beta2, static_cast<double>(step))));
  c.eps = static_cast<float>(o.eps());
  c.neg_step_size = static_cast<float>(-o.lr() / (1 - std::pow(beta1, static_cast<double>(step))));
  return c;
}

// Element i of the step; every operation rounds to float32 on its own (no fused multiply-add), so the
// vector lanes below compute exactly this.
inline void adamw_element(const AdamWConstants& c, float* p, const float* g, float* m, float* v, int64_t i) {
  const float grad = g[i];
  const float param = c.decay ? p[i] * c.keep : p[i];
  const float avg = m[i] * c.beta1 + c.one_minus_beta1 * grad;
  const float avg_sq = v[i] * c.beta2 + c.one_minus_beta2 * grad * grad;
  const float denom = std::sqrt(avg_sq) / c.sqrt_correction2 + c.eps;
  m[i] = avg;
  v[i] = avg_sq;
  p[i] = param + c.neg_step_size * avg / denom;
}

// Elements [begin, end): each read and written once. SSE's square root and division are IEEE-rounded like
// the scalar ones, so a lane's result does not depend on where the element sits.
void adamw_elements(const AdamWConstants& c, float* p, const float* g, float* m, float* v, int64_t begin,
                    int64_t end) {
  int64_t i = begin;
#ifdef __SSE2__
  const __m128 keep = _mm_set1_ps(c.decay ? c.keep : 1.0f), beta1 = _mm_set1_ps(c.beta1),
               one_minus_beta1 = _mm_set1_ps(c.one_minus_beta1), beta2 = _mm_set1_ps(c.beta2),
               one_minus_beta2 = _mm_set1_ps(c.one_minus_beta2), correction2 = _mm_set1_ps(c.sqrt_correction2),
               eps = _mm_set1_ps(c.eps), neg_step = _mm_set1_ps(c.neg_step_size);
  for (; i + 4 <= end; i += 4) {
    const __m128 grad = _mm_loadu_ps(g + i);
    __m128 param = _mm_loadu_ps(p + i);
    if (c.decay) param = _mm_mul_ps(param, keep);
    const __m128 avg = _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(m + i), beta1), _mm_mul_ps(one_minus_beta1, grad));
    const __m128 avg_sq =
        _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(v + i), beta2), _mm_mul_ps(_mm_mul_ps(one_minus_beta2, grad), grad));
    const __m128 denom = _mm_add_ps(_mm_div_ps(_mm_sqrt_ps(avg_sq), correction2), eps);
    _mm_storeu_ps(m + i, avg);
    _mm_storeu_ps(v + i, avg_sq);
    _mm_storeu_ps(p + i, _mm_add_ps(param, _mm_div_ps(_mm_mul_ps(neg_step, avg), denom)));
  }
#endif
  for (; i < end; ++i) adamw_element(c, p, g, m, v, i);
}

bool fused_loop_applies(const torch::Tensor& p, const torch::Tensor& g, const torch::Tensor& m,
                        const torch::Tensor& v) {
  for (const torch::Tensor* t : {&p, &g, &m, &v})
    if (!t->device().is_cpu() || t->scalar_type() != torch::kFloat || !t->is_contiguous()) return false;
  return true;
}

// The same arithmetic as tensor operations, for tensors the loop cannot touch (a GPU's).
void adamw_tensor_ops(const AdamWConstants& c, torch::Tensor& p, const torch::Tensor& g, torch::Tensor& m,
                      torch::Tensor& v) {
  if (c.decay) p.mul_(c.keep);
  m.mul_(c.beta1).add_(g * c.one_minus_beta1);
  v.mul_(c.beta2).add_(g * c.one_minus_beta2 * g);
  p.add_(m * c.neg_step_size / (v.sqrt() / c.sqrt_correction2 + c.eps));
}

}  // namespace

void fused_adamw_step(torch::optim::AdamW& optimizer) {
  torch::NoGradGuard no_grad;
  for (auto& group : optimizer.param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    HF_CHECK(!options.amsgrad(), "fused_adamw_step: amsgrad is not supported");
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const torch::Tensor g = p.grad();
      HF_CHECK(!g.is_sparse(), "fused_adamw_step: sparse gradients are not supported");
      auto& slot = optimizer.state()[p.unsafeGetTensorImpl()];
      if (!slot) {
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& state = static_cast<torch::optim::AdamWParamState&>(*slot);
      state.step(state.step() + 1);
      const AdamWConstants c = adamw_constants(options, state.step());
      torch::Tensor m = state.exp_avg(), v = state.exp_avg_sq();
      torch::Tensor param = p.detach();
      if (!fused_loop_applies(param, g, m, v)) {
        adamw_tensor_ops(c, param, g, m, v);
        continue;
      }
      float* pp = param.data_ptr<float>();
      const float* gp = g.data_ptr<float>();
      float* mp = m.data_ptr<float>();
      float* vp = v.data_ptr<float>();
      at::parallel_for(0, param.numel(), 1 << 15,
                       [&](int64_t begin, int64_t end) { adamw_elements(c, pp, gp, mp, vp, begin, end); });
    }
  }
}

}  // namespace hybridflow
