#include "hybridflow/engine/fused_adamw.h"

#include <ATen/Parallel.h>
#include <ATen/Version.h>

#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_fused_adamw.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HF_ADAMW_X86 1
#endif

#include "hybridflow/core/error.h"

namespace hybridflow {
namespace {

// The step's constants, rounded to float32 once, as libtorch's kernels round a double scalar for a float
// tensor.
struct AdamWConstants {
  bool decay = false;
  float keep = 1;  // 1 - lr * weight_decay
  float beta1 = 0, one_minus_beta1 = 0, beta2 = 0, one_minus_beta2 = 0;
  float sqrt_correction2 = 1;  // sqrt(1 - beta2^t)
  float eps = 0;
  float neg_step_size = 0;  // -lr / (1 - beta1^t)
  // libtorch's AVX2 / AVX-512 kernels compute add(x, alpha) and addcmul as one fused multiply-add; its
  // portable kernels round the product first. The loop follows whichever libtorch dispatches to.
  bool fused_multiply_add = false;
  // The gradient-norm clip's factor (clip_grad_norm_'s clamped coefficient as a float): each gradient element
  // is multiplied by it, rounded, and stored back first, as grad.mul_(coefficient) would. 1: left as it is.
  float grad_scale = 1;
};

bool libtorch_kernels_use_fma() {
#ifdef HF_ADAMW_X86
  // "DEFAULT", "AVX2" or "AVX512" (ATEN_CPU_CAPABILITY may lower it).
  static const bool vector_kernels = at::get_cpu_capability() != "DEFAULT";
  return vector_kernels && __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

AdamWConstants adamw_constants(const torch::optim::AdamWOptions& o, int64_t step, float grad_scale) {
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
  c.fused_multiply_add = libtorch_kernels_use_fma();
  c.grad_scale = grad_scale;
  return c;
}

// The first half of libtorch's step, element by element, in its rounding:
//   p *= keep;  m = m * beta1 + (1 - beta1) * g;  v = v * beta2 + ((1 - beta2) * g) * g
// Products before a fused multiply-add are rounded on their own (libtorch stores m * beta1 before add_).
void decay_and_moments_rounded(const AdamWConstants& c, float* p, float* g, float* m, float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (c.grad_scale != 1) g[i] = g[i] * c.grad_scale;
    if (c.decay) p[i] = p[i] * c.keep;
    const float m_scaled = m[i] * c.beta1, v_scaled = v[i] * c.beta2, g_scaled = c.one_minus_beta2 * g[i];
    const float m_term = c.one_minus_beta1 * g[i], v_term = g_scaled * g[i];
    m[i] = m_scaled + m_term;
    v[i] = v_scaled + v_term;
  }
}

#ifdef HF_ADAMW_X86
__attribute__((target("avx2,fma"))) void decay_and_moments_fma(const AdamWConstants& c, float* p, float* g, float* m,
                                                               float* v, int64_t n) {
  const __m256 keep = _mm256_set1_ps(c.keep), beta1 = _mm256_set1_ps(c.beta1),
               one_minus_beta1 = _mm256_set1_ps(c.one_minus_beta1), beta2 = _mm256_set1_ps(c.beta2),
               one_minus_beta2 = _mm256_set1_ps(c.one_minus_beta2), grad_scale = _mm256_set1_ps(c.grad_scale);
  const bool scaled = c.grad_scale != 1;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 grad = _mm256_loadu_ps(g + i);
    if (scaled) {
      grad = _mm256_mul_ps(grad, grad_scale);
      _mm256_storeu_ps(g + i, grad);
    }
    if (c.decay) _mm256_storeu_ps(p + i, _mm256_mul_ps(_mm256_loadu_ps(p + i), keep));
    _mm256_storeu_ps(m + i, _mm256_fmadd_ps(grad, one_minus_beta1, _mm256_mul_ps(_mm256_loadu_ps(m + i), beta1)));
    _mm256_storeu_ps(v + i, _mm256_fmadd_ps(_mm256_mul_ps(one_minus_beta2, grad), grad,
                                            _mm256_mul_ps(_mm256_loadu_ps(v + i), beta2)));
  }
  for (; i < n; ++i) {
    if (scaled) g[i] = g[i] * c.grad_scale;
    if (c.decay) p[i] = p[i] * c.keep;
    const float m_scaled = m[i] * c.beta1, v_scaled = v[i] * c.beta2, g_scaled = c.one_minus_beta2 * g[i];
    m[i] = std::fma(g[i], c.one_minus_beta1, m_scaled);
    v[i] = std::fma(g_scaled, g[i], v_scaled);
  }
}
#endif

// The second half: denom = sqrt(v) / sqrt(1 - beta2^t) + eps;  p = p + (-step_size * m) / denom, with
// `root` holding sqrt(v). Division, addition and multiplication are IEEE-rounded in SSE lanes as in scalars.
void apply_update(const AdamWConstants& c, float* p, const float* m, const float* root, int64_t n) {
  int64_t i = 0;
#ifdef HF_ADAMW_X86
  const __m128 correction2 = _mm_set1_ps(c.sqrt_correction2), eps = _mm_set1_ps(c.eps),
               neg_step = _mm_set1_ps(c.neg_step_size);
  for (; i + 4 <= n; i += 4) {
    const __m128 denom = _mm_add_ps(_mm_div_ps(_mm_loadu_ps(root + i), correction2), eps);
    const __m128 update = _mm_div_ps(_mm_mul_ps(neg_step, _mm_loadu_ps(m + i)), denom);
    _mm_storeu_ps(p + i, _mm_add_ps(_mm_loadu_ps(p + i), update));
  }
#endif
  for (; i < n; ++i) {
    const float denom = root[i] / c.sqrt_correction2 + c.eps;
    const float update = (c.neg_step_size * m[i]) / denom;
    p[i] = p[i] + update;
  }
}

// The square root is libtorch's own (at::sqrt_out, MKL's vector square root in the x86 wheels, which is not
// always the correctly rounded one), so the result is libtorch's to the bit. It runs between the two halves
// on blocks small enough to stay in cache, called from this thread: called from inside an OpenMP worker,
// libtorch's op opened nested parallel regions that waited for a scheduler tick each (47x slower at two
// threads on one large tensor).
constexpr int64_t kAdamWBlock = int64_t{1} << 20;
constexpr int64_t kAdamWGrain = int64_t{1} << 15;

void adamw_elements(const AdamWConstants& c, float* p, float* g, float* m, const torch::Tensor& v_flat,
                    torch::Tensor& root_buffer) {
  float* v = v_flat.data_ptr<float>();
  float* root = root_buffer.data_ptr<float>();
  const int64_t numel = v_flat.numel();
  for (int64_t b = 0; b < numel; b += kAdamWBlock) {
    const int64_t n = std::min(kAdamWBlock, numel - b);
    at::parallel_for(b, b + n, kAdamWGrain, [&](int64_t begin, int64_t end) {
#ifdef HF_ADAMW_X86
      if (c.fused_multiply_add) {
        decay_and_moments_fma(c, p + begin, g + begin, m + begin, v + begin, end - begin);
        return;
      }
#endif
      decay_and_moments_rounded(c, p + begin, g + begin, m + begin, v + begin, end - begin);
    });
    torch::Tensor block_root = root_buffer.narrow(0, 0, n);
    at::sqrt_out(block_root, v_flat.narrow(0, b, n));
    at::parallel_for(b, b + n, kAdamWGrain, [&](int64_t begin, int64_t end) {
      apply_update(c, p + begin, m + begin, root + (begin - b), end - begin);
    });
  }
}

bool fused_loop_applies(const torch::Tensor& p, const torch::Tensor& g, const torch::Tensor& m,
                        const torch::Tensor& v) {
  for (const torch::Tensor* t : {&p, &g, &m, &v})
    if (!t->device().is_cpu() || t->scalar_type() != torch::kFloat || !t->is_contiguous()) return false;
  return true;
}

// libtorch's own tensor operations, for tensors the loop cannot touch (a GPU's, a strided one).
void adamw_tensor_ops(const torch::optim::AdamWOptions& o, int64_t step, float grad_scale, torch::Tensor& p,
                      torch::Tensor g, torch::Tensor& m, torch::Tensor& v) {
  if (grad_scale != 1) g.mul_(torch::tensor(grad_scale, g.options()));
  const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
  if (o.weight_decay() != 0) p.mul_(1 - o.lr() * o.weight_decay());
  m.mul_(beta1).add_(g, 1 - beta1);
  v.mul_(beta2).addcmul_(g, g, 1 - beta2);
  const double correction1 = 1 - std::pow(beta1, static_cast<double>(step));
  const double correction2 = 1 - std::pow(beta2, static_cast<double>(step));
  const torch::Tensor denom = (v.sqrt() / std::sqrt(correction2)).add_(o.eps());
  p.addcdiv_(m, denom, -o.lr() / correction1);
}

// Parameters of one group that the multi-tensor kernel steps together: same device, dtype and step count.
struct MultiTensorBatch {
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs;
};

bool multi_tensor_applies(const torch::Tensor& p, const torch::Tensor& g, const torch::Tensor& m,
                          const torch::Tensor& v) {
  for (const torch::Tensor* t : {&p, &g, &m, &v})
    if (t->device() != p.device() || t->scalar_type() != p.scalar_type() || !t->is_contiguous()) return false;
  return p.is_floating_point();
}

void step_multi_tensor(const torch::optim::AdamWOptions& o, int64_t step, float grad_scale, const MultiTensorBatch& b) {
  // The clip's factor, into the gradients as adamw_tensor_ops applies it (one launch for the batch).
  if (grad_scale != 1) at::_foreach_mul_(b.grads, grad_scale);
  // The kernel reads each parameter's step count (already advanced) from a float32 tensor on its device.
  const auto steps = torch::full({static_cast<int64_t>(b.params.size())}, static_cast<float>(step),
                                 torch::TensorOptions().dtype(torch::kFloat).device(b.params.front().device()))
                         .unbind();
  at::_fused_adamw_(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, {}, steps, o.lr(), std::get<0>(o.betas()),
                    std::get<1>(o.betas()), o.weight_decay(), o.eps(), /*amsgrad=*/false, /*maximize=*/false);
}

}  // namespace

void fused_adamw_step(torch::optim::AdamW& optimizer, float grad_scale, AdamWPath path) {
  torch::NoGradGuard no_grad;
  torch::Tensor root_buffer;  // sqrt(v) of one block
  for (auto& group : optimizer.param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    HF_CHECK(!options.amsgrad(), "fused_adamw_step: amsgrad is not supported");
    std::map<std::tuple<std::string, c10::ScalarType, int64_t>, MultiTensorBatch> batches;
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
      torch::Tensor m = state.exp_avg(), v = state.exp_avg_sq();
      torch::Tensor param = p.detach();
      const bool loop = path == AdamWPath::kAuto && fused_loop_applies(param, g, m, v);
      if (!loop && (path == AdamWPath::kMultiTensor || !param.device().is_cpu()) && multi_tensor_applies(param, g, m, v)) {
        MultiTensorBatch& b = batches[{param.device().str(), param.scalar_type(), state.step()}];
        b.params.push_back(param);
        b.grads.push_back(g);
        b.exp_avgs.push_back(m);
        b.exp_avg_sqs.push_back(v);
        continue;
      }
      if (!loop) {
        adamw_tensor_ops(options, state.step(), grad_scale, param, g, m, v);
        continue;
      }
      const AdamWConstants c = adamw_constants(options, state.step(), grad_scale);
      if (!root_buffer.defined() || root_buffer.numel() < std::min(kAdamWBlock, param.numel()))
        root_buffer = torch::empty({std::min(kAdamWBlock, std::max<int64_t>(param.numel(), 1))}, torch::kFloat);
      adamw_elements(c, param.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.view({-1}),
                     root_buffer);
    }
    for (const auto& [key, batch] : batches) step_multi_tensor(options, std::get<2>(key), grad_scale, batch);
  }
}

}  // namespace hybridflow
