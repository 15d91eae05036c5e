#include "hybridflow/model/rms_norm.h"

#include <cstdlib>
#include <string_view>

namespace hybridflow {

bool rms_norm_fused_for(const torch::Tensor& x, const torch::Tensor& weight) {
  static const bool switched_off = [] {
    const char* v = std::getenv("HF_FUSED_RMS_NORM");
    return v != nullptr && (std::string_view(v) == "off" || std::string_view(v) == "0");
  }();
  return !switched_off && x.is_cuda() && torch::GradMode::is_enabled() &&
         (x.requires_grad() || weight.requires_grad()) && x.scalar_type() == weight.scalar_type();
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  // at::rms_norm, public since libtorch 2.4, dispatches to the fused kernel on CUDA (_fused_rms_norm, since 2.8;
  // the GPU check asserts the fused backward): a signature that compiles against the GPU machine's libtorch.
  if (rms_norm_fused_for(x, weight)) return at::rms_norm(x, {x.size(-1)}, weight, eps);
  auto h = x.to(torch::kFloat32);
  h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * h.to(x.scalar_type());
}

}  // namespace hybridflow
