// The fused decode kernels' checks, their dispatch (CUDA kernels on CUDA tensors, decode_fusions.cu) and their
// CPU references, which compute the same arithmetic (kernels/element_math.h) in plain loops.
#include "hybridflow/kernels/decode_fusions.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "hybridflow/core/error.h"
#include "kernels/element_math.h"
#include "kernels/kernel_dtypes.h"

#ifdef HF_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "kernels/fusion_launch.h"
#endif

namespace hybridflow::kernels {
namespace {

// The sequential sum of squares, inverse and norm of one head, as decode_kernels.cpp's rms_norm reference.
template <typename Round>
void norm_head_reference(float* x, const float* weight, int64_t dim, float eps, Round round) {
  float squares = 0.0f;
  for (int64_t i = 0; i < dim; ++i) squares += x[i] * x[i];
  const float inverse = math::rms_inverse(squares, static_cast<int>(dim), eps);
  for (int64_t i = 0; i < dim; ++i) x[i] = math::rms_norm_element(x[i], inverse, weight[i], round);
}

template <typename Round>
void rotate_head_reference(const float* x, const float* cos, const float* sin, int64_t dim, float* out, Round round) {
  const int64_t half = dim / 2;
  for (int64_t i = 0; i < dim; ++i) {
    const bool first_half = i < half;
    out[i] = math::rotary_element(x[i], x[first_half ? i + half : i - half], first_half, cos[i], sin[i], round);
  }
}

}  // namespace

torch::Tensor qk_norm_rotary_cache_write(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                         const torch::Tensor& q_norm, const torch::Tensor& k_norm, double eps,
                                         const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& key_pool,
                                         torch::Tensor& value_pool, const torch::Tensor& tables,
                                         const torch::Tensor& lengths) {
  RECORD_FUNCTION("hybridflow::qk_norm_rotary_cache_write", std::vector<c10::IValue>());
  const char* what = "kernels::qk_norm_rotary_cache_write";
  const auto dtype = q.defined() ? q.scalar_type() : torch::kFloat32;
  HF_CHECK(q.defined() && (dtype == torch::kFloat32 || dtype == torch::kFloat16 || dtype == torch::kBFloat16), what,
           ": expected float32, float16 or bfloat16 queries");
  HF_CHECK(q_norm.defined() == k_norm.defined(), what, ": q_norm and k_norm must be given together (Qwen3) or not");
  std::vector<const torch::Tensor*> operands = {&k, &v, &cos, &sin, &key_pool, &value_pool};
  if (q_norm.defined()) operands.insert(operands.end(), {&q_norm, &k_norm});
  for (const torch::Tensor* t : operands)
    HF_CHECK(t->defined() && t->scalar_type() == dtype && t->device() == q.device(), what, ": every operand must be a ",
             dtype, " tensor on ", q.device(), ", got ",
             t->defined() ? c10::toString(t->scalar_type()) : "an undefined tensor", " on ",
             t->defined() ? t->device().str() : "no device");
#ifndef HF_WITH_CUDA
  HF_CHECK(!q.is_cuda(), what, ": a CUDA tensor in a build without CUDA kernels (HF_CUDA=1)");
#endif
  HF_CHECK(q.is_cpu() || q.is_cuda(), what, ": tensors on ", q.device(), " (expected CPU or CUDA)");
  HF_CHECK(q.dim() == 3 && k.dim() == 3 && v.sizes() == k.sizes() && k.size(0) == q.size(0) &&
               k.size(2) == q.size(2) && q.size(2) % 2 == 0 && q.size(2) <= 256,
           what, ": expected q [rows, heads, head_dim] and k, v [rows, kv_heads, head_dim] (head_dim even, at most ",
           "256), got ", q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  const int64_t rows = q.size(0), heads = q.size(1), kv = k.size(1), dim = q.size(2);
  HF_CHECK(cos.dim() == 2 && cos.size(0) == rows && cos.size(1) == dim && sin.sizes() == cos.sizes(), what,
           ": expected cos and sin [", rows, ", ", dim, "], got ", cos.sizes(), " and ", sin.sizes());
  HF_CHECK(!q_norm.defined() || (q_norm.dim() == 1 && q_norm.size(0) == dim && k_norm.sizes() == q_norm.sizes()),
           what, ": expected q_norm and k_norm [", dim, "]");
  HF_CHECK(key_pool.dim() == 4 && key_pool.size(1) == kv && key_pool.size(3) == dim &&
               value_pool.sizes() == key_pool.sizes() && key_pool.is_contiguous() && value_pool.is_contiguous(),
           what, ": expected contiguous key and value pools [blocks, ", kv, ", block_size, ", dim, "], got ",
           key_pool.sizes(), " and ", value_pool.sizes());
  HF_CHECK(tables.dim() == 2 && tables.size(0) == rows && tables.size(1) > 0 && lengths.dim() == 1 &&
               lengths.size(0) == rows && tables.scalar_type() == torch::kInt64 &&
               lengths.scalar_type() == torch::kInt64 && tables.device() == q.device() &&
               lengths.device() == q.device(),
           what, ": expected tables [", rows, ", width] and lengths [", rows, "], int64 on ", q.device(), ", got ",
           tables.sizes(), " ", tables.scalar_type(), " and ", lengths.sizes(), " ", lengths.scalar_type());
  const int64_t block_size = key_pool.size(2), width = tables.size(1);
  const auto qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  const auto cc = cos.contiguous(), sc = sin.contiguous(), tc = tables.contiguous(), lc = lengths.contiguous();
  auto out = torch::empty_like(qc);

  if (q.is_cuda()) {
#ifdef HF_WITH_CUDA
    HF_CHECK(rows < 65536 && heads + kv < 65536, what, ": at most 65535 rows and heads, got ", rows, " and ",
             heads + kv);
    const c10::cuda::CUDAGuard guard(q.device());
    const auto qn = q_norm.defined() ? q_norm.contiguous() : torch::Tensor();
    const auto kn = k_norm.defined() ? k_norm.contiguous() : torch::Tensor();
    cuda::QkRotaryCacheWrite args{qc.data_ptr(),
                                  kc.data_ptr(),
                                  vc.data_ptr(),
                                  qn.defined() ? qn.data_ptr() : nullptr,
                                  kn.defined() ? kn.data_ptr() : nullptr,
                                  cc.data_ptr(),
                                  sc.data_ptr(),
                                  out.data_ptr(),
                                  key_pool.data_ptr(),
                                  value_pool.data_ptr(),
                                  tc.data_ptr<int64_t>(),
                                  lc.data_ptr<int64_t>(),
                                  rows,
                                  heads,
                                  kv,
                                  dim,
                                  width,
                                  block_size,
                                  static_cast<float>(eps)};
    const char* error = cuda::qk_norm_rotary_cache_write(
        detail::cuda_dtype_of(dtype), args, at::cuda::getCurrentCUDAStream(q.device().index()).stream());
    HF_CHECK(error == nullptr, what, ": CUDA launch failed: ", error);
#endif
    return out;
  }

  // The CPU reference: each head normed and rotated in float, rounded as the kernel rounds; the keys and values
  // written at the rows' positions.
  using detail::float_copy;
  const auto qf = float_copy(qc), kf = float_copy(kc), cf = float_copy(cc), sf = float_copy(sc);
  const auto qnf = q_norm.defined() ? float_copy(q_norm) : torch::Tensor();
  const auto knf = k_norm.defined() ? float_copy(k_norm) : torch::Tensor();
  auto q_rot = torch::empty({rows, heads, dim}, torch::kFloat32), k_rot = torch::empty({rows, kv, dim}, torch::kFloat32);
  const int64_t* tp = tc.data_ptr<int64_t>();
  const int64_t* lp = lc.data_ptr<int64_t>();
  auto index = torch::empty({rows * kv}, torch::kInt64);
  int64_t* ip = index.data_ptr<int64_t>();
  const int64_t blocks = key_pool.size(0);
  std::vector<float> head(static_cast<size_t>(dim));
  detail::with_reference_rounding(dtype, [&](auto round) {
    auto one_head = [&](const float* x, const torch::Tensor& weight, const float* c, const float* s, float* dst) {
      std::copy(x, x + dim, head.begin());
      if (weight.defined()) norm_head_reference(head.data(), weight.data_ptr<float>(), dim, static_cast<float>(eps), round);
      rotate_head_reference(head.data(), c, s, dim, dst, round);
    };
    for (int64_t r = 0; r < rows; ++r) {
      const float* c = cf.data_ptr<float>() + r * dim;
      const float* s = sf.data_ptr<float>() + r * dim;
      for (int64_t h = 0; h < heads; ++h)
        one_head(qf.data_ptr<float>() + (r * heads + h) * dim, qnf, c, s, q_rot.data_ptr<float>() + (r * heads + h) * dim);
      const int64_t position = lp[r];
      HF_CHECK(position >= 0 && position / block_size < width, what, ": row ", r, " writes position ", position,
               " past its table of ", width, " blocks of ", block_size);
      const int64_t block = tp[r * width + position / block_size];
      HF_CHECK(block >= 0 && block < blocks, what, ": row ", r, " names block ", block, " of ", blocks);
      for (int64_t h = 0; h < kv; ++h) {
        one_head(kf.data_ptr<float>() + (r * kv + h) * dim, knf, c, s, k_rot.data_ptr<float>() + (r * kv + h) * dim);
        ip[r * kv + h] = (block * kv + h) * block_size + position % block_size;
      }
    }
  });
  key_pool.view({-1, dim}).index_copy_(0, index, k_rot.view({-1, dim}).to(dtype));
  value_pool.view({-1, dim}).index_copy_(0, index, vc.view({-1, dim}));
  out.copy_(q_rot);
  return out;
}

RotaryTables rotary_tables(const torch::Tensor& positions, const torch::Tensor& inv_freq, double attention_scaling,
                           torch::ScalarType dtype) {
  RECORD_FUNCTION("hybridflow::rotary_tables", std::vector<c10::IValue>());
  const char* what = "kernels::rotary_tables";
  HF_CHECK(dtype == torch::kFloat32 || dtype == torch::kFloat16 || dtype == torch::kBFloat16, what,
           ": expected a float32, float16 or bfloat16 table dtype, got ", dtype);
  HF_CHECK(positions.defined() && positions.dim() == 1 && positions.scalar_type() == torch::kInt64, what,
           ": expected positions [rows] int64");
  HF_CHECK(inv_freq.defined() && inv_freq.dim() == 1 && inv_freq.size(0) > 0 && inv_freq.scalar_type() == torch::kFloat32,
           what, ": expected inv_freq [head_dim / 2] float32");
#ifndef HF_WITH_CUDA
  HF_CHECK(!positions.is_cuda(), what, ": a CUDA tensor in a build without CUDA kernels (HF_CUDA=1)");
#endif
  HF_CHECK(positions.is_cpu() || positions.is_cuda(), what, ": positions on ", positions.device(),
           " (expected CPU or CUDA)");
  const int64_t rows = positions.size(0), half = inv_freq.size(0), dim = 2 * half;
  const auto pc = positions.contiguous();
  const auto fc = inv_freq.to(positions.device()).contiguous();
  const bool scaled = attention_scaling != 1.0;
  const auto scaling = static_cast<float>(attention_scaling);
  RotaryTables out;
  if (positions.is_cuda()) {
#ifdef HF_WITH_CUDA
    HF_CHECK(rows < (int64_t{1} << 31), what, ": too many rows (", rows, ")");
    const c10::cuda::CUDAGuard guard(positions.device());
    const auto options = torch::TensorOptions().dtype(dtype).device(positions.device());
    out.cos = torch::empty({rows, dim}, options);
    out.sin = torch::empty({rows, dim}, options);
    const char* error = cuda::rotary_tables(detail::cuda_dtype_of(dtype), pc.data_ptr<int64_t>(), fc.data_ptr<float>(),
                                            scaling, scaled, out.cos.data_ptr(), out.sin.data_ptr(), rows, dim,
                                            at::cuda::getCurrentCUDAStream(positions.device().index()).stream());
    HF_CHECK(error == nullptr, what, ": CUDA launch failed: ", error);
#endif
    return out;
  }
  // The CPU reference: the same fp32 angle, libm's cosine and sine, the scaling, one rounding to dtype.
  auto cos = torch::empty({rows, dim}, torch::kFloat32), sin = torch::empty({rows, dim}, torch::kFloat32);
  const int64_t* pp = pc.data_ptr<int64_t>();
  const float* fp = fc.data_ptr<float>();
  float* cp = cos.data_ptr<float>();
  float* sp = sin.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const auto position = static_cast<float>(pp[r]);
    for (int64_t i = 0; i < dim; ++i) {
      const float angle = position * fp[i % half];
      float c = std::cos(angle), s = std::sin(angle);
      if (scaled) {
        c = c * scaling;
        s = s * scaling;
      }
      cp[r * dim + i] = c;
      sp[r * dim + i] = s;
    }
  }
  out.cos = cos.to(dtype);
  out.sin = sin.to(dtype);
  return out;
}

}  // namespace hybridflow::kernels
