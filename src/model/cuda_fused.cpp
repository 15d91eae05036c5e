// The fused CUDA paths of model/cuda_fused.h and the checks that pick them.
#include "hybridflow/model/cuda_fused.h"

#include <ATen/ops/_flash_attention_forward.h>
#ifdef HF_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include "hybridflow/core/error.h"

namespace hybridflow {
namespace {

thread_local bool portable_kernels_forced = false;

// The compute capability's major number of x's GPU (0 in a CPU build or for a CPU tensor).
int cuda_major(const torch::Tensor& x) {
#ifdef HF_WITH_CUDA
  if (x.is_cuda()) return at::cuda::getDeviceProperties(x.device().index())->major;
#endif
  (void)x;
  return 0;
}

}  // namespace

PortableKernelsGuard::PortableKernelsGuard(bool on) : previous_(portable_kernels_forced) {
  portable_kernels_forced = previous_ || on;
}

PortableKernelsGuard::~PortableKernelsGuard() { portable_kernels_forced = previous_; }

bool grouped_expert_gemm_applies(const torch::Tensor& rows, torch::Dtype weight_dtype, int64_t hidden,
                                 int64_t expert_width) {
  // 16-byte aligned rows for every operand of the three projections; Hopper's bf16 grouped kernel.
  return !portable_kernels_forced && rows.is_cuda() && rows.scalar_type() == torch::kBFloat16 &&
         weight_dtype == torch::kBFloat16 && hidden % 8 == 0 && expert_width % 8 == 0 && cuda_major(rows) >= 9;
}

bool varlen_flash_attention_applies(const torch::Tensor& q) {
  const auto dtype = q.scalar_type();
  const int64_t head_dim = q.size(-1);
  return !portable_kernels_forced && q.is_cuda() && (dtype == torch::kBFloat16 || dtype == torch::kHalf) &&
         head_dim % 8 == 0 && head_dim <= 256 && cuda_major(q) >= 8;
}

torch::Tensor varlen_flash_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const std::vector<int64_t>& sequence_starts, int64_t longest, double scale) {
  HF_CHECK(q.dim() == 4 && q.size(0) == 1 && k.size(0) == 1 && v.size(0) == 1 && !sequence_starts.empty() &&
               sequence_starts.front() == 0,
           "varlen_flash_attention: expects one packed row [1, heads, T, d] and sequence starts from 0, got q ",
           q.sizes());
  const int64_t t = q.size(2);
  // [T, heads, d], the layout of flash attention's variable-length form.
  auto tokens_major = [](const torch::Tensor& x) { return x[0].transpose(0, 1).contiguous(); };
  std::vector<int32_t> bounds(sequence_starts.begin(), sequence_starts.end());
  bounds.push_back(static_cast<int32_t>(t));
  const auto cumulative = torch::tensor(bounds, torch::kInt32).to(q.device());
  auto out = std::get<0>(at::_flash_attention_forward(tokens_major(q), tokens_major(k), tokens_major(v), cumulative,
                                                      cumulative, longest, longest, /*dropout_p=*/0.0,
                                                      /*is_causal=*/true, /*return_debug_mask=*/false, scale));
  return out.transpose(0, 1).unsqueeze(0);
}

}  // namespace hybridflow
