// The few-rows projections' switch, checks, dispatch (the CUDA kernel on CUDA tensors, few_rows_linear.cu) and
// CPU reference, which follows the kernel's lanes and butterfly so that the two agree bit for bit.
#include "hybridflow/kernels/few_rows_linear.h"

#include <ATen/record_function.h>

#include <array>
#include <atomic>

#include "hybridflow/core/env_switch.h"
#include "hybridflow/core/error.h"
#include "hybridflow/kernels/decode_kernels.h"
#include "kernels/element_math.h"
#include "kernels/kernel_dtypes.h"

#ifdef HF_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "kernels/few_rows_launch.h"
#endif

namespace hybridflow::kernels {
namespace {

// The lanes of the CUDA kernel's warp (few_rows_launch.h's kFewRowsLanes, which a CPU build does not include).
constexpr int64_t kWarpLanes = 32;
constexpr int64_t kFewRowsVectorBytes = 16;

std::atomic<bool>& few_rows_enabled_slot() {
  static std::atomic<bool> slot{env_switch("HF_DECODE_GEMV", false, "the few-rows projection kernels of the decode step")};
  return slot;
}

bool vector_aligned(const torch::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % kFewRowsVectorBytes == 0; }

// The elements in one 16-byte vector of the dtype.
int64_t vector_elements_of(torch::ScalarType t) { return kFewRowsVectorBytes / static_cast<int64_t>(c10::elementSize(t)); }

void check_few_rows_operands(const char* what, const torch::Tensor& x, const std::vector<torch::Tensor>& weights,
                             const std::vector<torch::Tensor>& biases) {
  HF_CHECK(x.defined() && detail::kernel_dtype(x.scalar_type()), "kernels::", what,
           ": expected a float32, float16 or bfloat16 input, got ",
           x.defined() ? c10::toString(x.scalar_type()) : "an undefined tensor");
  HF_CHECK(x.is_cpu() || x.is_cuda(), "kernels::", what, ": tensors on ", x.device(), " (expected CPU or CUDA)");
#ifndef HF_WITH_CUDA
  HF_CHECK(!x.is_cuda(), "kernels::", what, ": a CUDA tensor in a build without CUDA kernels (HF_CUDA=1)");
#endif
  HF_CHECK(x.dim() == 2 && x.size(0) >= 1 && x.size(0) <= kFewRowsMax, "kernels::", what, ": expected x [rows, k] with 1 to ",
           kFewRowsMax, " rows, got ", x.sizes());
  HF_CHECK(x.size(1) % vector_elements_of(x.scalar_type()) == 0, "kernels::", what, ": k must be a multiple of ",
           vector_elements_of(x.scalar_type()), " (16-byte vectors of ", x.scalar_type(), "), got ", x.size(1));
  HF_CHECK(!weights.empty() && weights.size() <= 3, "kernels::", what, ": expected one to three weights, got ",
           weights.size());
  HF_CHECK(biases.empty() || biases.size() == weights.size(), "kernels::", what,
           ": expected no biases or one per weight, got ", biases.size(), " for ", weights.size(), " weights");
  for (size_t i = 0; i < weights.size(); ++i) {
    const torch::Tensor& w = weights[i];
    HF_CHECK(w.defined() && w.scalar_type() == x.scalar_type() && w.device() == x.device() && w.dim() == 2 &&
                 w.size(1) == x.size(1),
             "kernels::", what, ": weight ", i, " must be a ", x.scalar_type(), " tensor [n, ", x.size(1), "] on ",
             x.device(), ", got ", w.defined() ? c10::toString(w.scalar_type()) : "an undefined tensor", " ",
             w.defined() ? w.sizes() : x.sizes(), " on ", w.defined() ? w.device().str() : "no device");
    if (biases.empty() || !biases[i].defined()) continue;
    HF_CHECK(biases[i].scalar_type() == x.scalar_type() && biases[i].device() == x.device() && biases[i].dim() == 1 &&
                 biases[i].size(0) == w.size(0),
             "kernels::", what, ": bias ", i, " must be a ", x.scalar_type(), " tensor [", w.size(0), "] on ",
             x.device(), ", got ", biases[i].sizes());
  }
}

// One warp's sum for an output column: each lane's vectors in turn (lane l: l, l + 32, ...), then the butterfly
// (every lane adds its partner's partial at distance 16, 8, 4, 2, 1, the kernel's __shfl_xor_sync steps).
float warp_order_dot(const float* w, const float* x, int64_t k, int64_t vec) {
  const int64_t vectors = k / vec;
  std::array<float, kWarpLanes> lanes{};
  for (int64_t l = 0; l < kWarpLanes; ++l) {
    float acc = 0.0f;
    for (int64_t c = l; c < vectors; c += kWarpLanes)
      for (int64_t j = c * vec; j < (c + 1) * vec; ++j) acc = acc + w[j] * x[j];
    lanes[static_cast<size_t>(l)] = acc;
  }
  for (int64_t offset = kWarpLanes / 2; offset > 0; offset /= 2) {
    std::array<float, kWarpLanes> next{};
    for (int64_t l = 0; l < kWarpLanes; ++l)
      next[static_cast<size_t>(l)] = lanes[static_cast<size_t>(l)] + lanes[static_cast<size_t>(l ^ offset)];
    lanes = next;
  }
  return lanes[0];
}

#ifdef HF_WITH_CUDA
void check_aligned_on_cuda(const char* what, const torch::Tensor& t) {
  HF_CHECK(vector_aligned(t), "kernels::", what, ": CUDA operands must start on a 16-byte boundary");
}

void launch_on_cuda(const char* what, cuda::FewRowsLinear& args, const torch::Tensor& x) {
  const c10::cuda::CUDAGuard guard(x.device());
  args.x = x.data_ptr();
  args.rows = x.size(0);
  args.k = x.size(1);
  const char* error = cuda::few_rows_linear(detail::cuda_dtype_of(x.scalar_type()), args,
                                            at::cuda::getCurrentCUDAStream(x.device().index()).stream());
  HF_CHECK(error == nullptr, "kernels::", what, ": CUDA launch failed: ", error);
}
#endif

}  // namespace

bool few_rows_linear_enabled() { return few_rows_enabled_slot().load(); }
void set_few_rows_linear_enabled(bool on) { few_rows_enabled_slot().store(on); }

bool few_rows_linear_applies(const torch::Tensor& x, std::initializer_list<torch::Tensor> weights) {
  if (!few_rows_linear_enabled() || !x.defined() || !active_for(x.device()) || !detail::kernel_dtype(x.scalar_type()) ||
      x.dim() != 2 || x.size(0) < 1 || x.size(0) > kFewRowsMax || !x.is_contiguous() || !vector_aligned(x) ||
      x.size(1) % vector_elements_of(x.scalar_type()) != 0)
    return false;
#ifndef HF_WITH_CUDA
  if (x.is_cuda()) return false;
#endif
  for (const torch::Tensor& w : weights)
    if (!w.defined() || w.scalar_type() != x.scalar_type() || w.device() != x.device() || w.dim() != 2 ||
        w.size(1) != x.size(1) || !w.is_contiguous() || !vector_aligned(w))
      return false;
  return true;
}

std::vector<torch::Tensor> few_rows_linear(const torch::Tensor& x, const std::vector<torch::Tensor>& weights,
                                           const std::vector<torch::Tensor>& biases, bool float_out) {
  RECORD_FUNCTION("hybridflow::few_rows_linear", std::vector<c10::IValue>());
  const char* what = "few_rows_linear";
  check_few_rows_operands(what, x, weights, biases);
  const auto out_options = x.options().dtype(float_out ? torch::kFloat32 : x.scalar_type());
  std::vector<torch::Tensor> outputs(weights.size());
  const auto bias_of = [&](size_t i) { return biases.empty() ? torch::Tensor() : biases[i]; };
  if (x.is_cuda()) {
#ifdef HF_WITH_CUDA
    for (size_t i = 0; i < weights.size(); ++i) outputs[i] = torch::empty({x.size(0), weights[i].size(0)}, out_options);
    const auto x_c = x.contiguous();
    std::vector<torch::Tensor> held = {x_c};  // the contiguous operands, alive until the launch is queued
    cuda::FewRowsLinear args{};
    for (size_t i = 0; i < weights.size(); ++i) {
      held.push_back(weights[i].contiguous());
      check_aligned_on_cuda(what, held.back());
      args.weight[i] = held.back().data_ptr();
      args.n[i] = weights[i].size(0);
      args.out[i] = outputs[i].data_ptr();
      const torch::Tensor b = bias_of(i);
      if (b.defined()) {
        held.push_back(b.contiguous());
        args.bias[i] = held.back().data_ptr();
      }
    }
    check_aligned_on_cuda(what, x_c);
    args.float_out = float_out;
    launch_on_cuda(what, args, x_c);
#endif
    return outputs;
  }
  const int64_t rows = x.size(0), k = x.size(1), vec = vector_elements_of(x.scalar_type());
  const auto xf = detail::float_copy(x);
  detail::with_reference_rounding(x.scalar_type(), [&](auto round) {
    for (size_t i = 0; i < weights.size(); ++i) {
      const auto wf = detail::float_copy(weights[i]);
      const torch::Tensor b = bias_of(i);
      const auto bf = b.defined() ? detail::float_copy(b) : torch::Tensor();
      const int64_t n = weights[i].size(0);
      auto values = torch::empty({rows, n}, torch::kFloat32);
      float* out = values.data_ptr<float>();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < n; ++o) {
          float v = warp_order_dot(wf.data_ptr<float>() + o * k, xf.data_ptr<float>() + r * k, k, vec);
          if (bf.defined()) v = v + bf.data_ptr<float>()[o];
          out[r * n + o] = round(v);
        }
      outputs[i] = values.to(out_options.dtype());
    }
  });
  return outputs;
}

torch::Tensor few_rows_swiglu(const torch::Tensor& x, const torch::Tensor& gate, const torch::Tensor& up) {
  RECORD_FUNCTION("hybridflow::few_rows_swiglu", std::vector<c10::IValue>());
  const char* what = "few_rows_swiglu";
  check_few_rows_operands(what, x, {gate, up}, {});
  HF_CHECK(gate.size(0) == up.size(0), "kernels::", what, ": gate and up must have one shape, got ", gate.sizes(),
           " and ", up.sizes());
  auto out = torch::empty({x.size(0), gate.size(0)}, x.options());
  if (x.is_cuda()) {
#ifdef HF_WITH_CUDA
    const auto x_c = x.contiguous(), g = gate.contiguous(), u = up.contiguous();
    for (const torch::Tensor* t : {&x_c, &g, &u}) check_aligned_on_cuda(what, *t);
    cuda::FewRowsLinear args{};
    args.weight[0] = g.data_ptr();
    args.weight[1] = u.data_ptr();
    args.n[0] = g.size(0);
    args.out[0] = out.data_ptr();
    args.swiglu = true;
    launch_on_cuda(what, args, x_c);
#endif
    return out;
  }
  const int64_t rows = x.size(0), k = x.size(1), n = gate.size(0), vec = vector_elements_of(x.scalar_type());
  const auto xf = detail::float_copy(x), gf = detail::float_copy(gate), uf = detail::float_copy(up);
  auto values = torch::empty({rows, n}, torch::kFloat32);
  float* o = values.data_ptr<float>();
  detail::with_reference_rounding(x.scalar_type(), [&](auto round) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < n; ++c) {
        const float* xr = xf.data_ptr<float>() + r * k;
        const float g_v = round(warp_order_dot(gf.data_ptr<float>() + c * k, xr, k, vec));
        const float u_v = round(warp_order_dot(uf.data_ptr<float>() + c * k, xr, k, vec));
        o[r * n + c] = math::swiglu_element(g_v, u_v, round);
      }
  });
  return values.to(x.scalar_type());
}

}  // namespace hybridflow::kernels
