#include "model/rotary_rows.h"

#include "hybridflow/core/error.h"
#include "hybridflow/kernels/decode_kernels.h"

namespace hybridflow {
namespace {

// cos or sin [B or 1, 1, T, d] as the kernel's [B * T, d], one row per token of x [B, T, heads, d].
torch::Tensor per_token(const torch::Tensor& table, const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), d = x.size(3);
  return table.expand({b, 1, t, d}).reshape({b * t, d}).contiguous();
}

struct RotaryRowsFunction : public torch::autograd::Function<RotaryRowsFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    const int64_t b = x.size(0), t = x.size(1), heads = x.size(2), d = x.size(3);
    return kernels::rotary(x.contiguous().view({b * t, heads, d}), cos, sin).view({b, t, heads, d});
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& g = grads[0];
    const int64_t b = g.size(0), t = g.size(1), heads = g.size(2), d = g.size(3);
    // rotate_half's transpose is -rotate_half where cos and sin repeat their halves: the same kernel, sin negated.
    auto dx = kernels::rotary(g.contiguous().view({b * t, heads, d}), saved[0], saved[1].neg()).view({b, t, heads, d});
    return {dx, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool rotary_rows_apply(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const auto dtype = x.scalar_type();
  return kernels::active_for(x.device()) && x.dim() == 4 && x.is_contiguous() && x.size(3) % 2 == 0 &&
         (dtype == torch::kFloat32 || dtype == torch::kBFloat16 || dtype == torch::kHalf) && cos.dim() == 4 &&
         cos.sizes() == sin.sizes() && cos.size(1) == 1 && cos.size(2) == x.size(1) && cos.size(3) == x.size(3) &&
         (cos.size(0) == 1 || cos.size(0) == x.size(0)) && cos.scalar_type() == dtype && sin.scalar_type() == dtype &&
         cos.device() == x.device() && !cos.requires_grad() && !sin.requires_grad();
}

torch::Tensor rotary_rows(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  HF_CHECK(rotary_rows_apply(x, cos, sin), "rotary_rows: expected x [B, T, heads, head_dim] (contiguous, even head_dim) "
           "and cos, sin [B or 1, 1, T, head_dim] of its dtype without gradients, where the kernels apply; got x ",
           x.sizes(), " ", x.scalar_type(), ", cos ", cos.sizes(), " ", cos.scalar_type());
  return RotaryRowsFunction::apply(x, per_token(cos, x), per_token(sin, x));
}

}  // namespace hybridflow
