// The rotary embedding of a pass's queries or keys as one kernel each way on a GPU (kernels::rotary, the decode
// step's), where the operators x * cos + rotate_half(x) * sin launch about five kernels forward and eight
// backward, each streaming the layer's activations.
//
// Both directions equal the operators bit for bit: the kernel rounds each product to the dtype before the sum as
// the operators store them, and rotate_half's transpose is -rotate_half wherever cos and sin repeat their first
// half in the second (every RoPE variant builds them so), so the gradient is the same kernel with sin negated.
// The passes with and without gradients therefore still agree bit for bit (PPO's ratio starts at 1).
#pragma once

#include <torch/torch.h>

namespace hybridflow {

// Whether x [B, T, heads, head_dim] (contiguous, as projected) takes the kernel with cos and sin
// [B or 1, 1, T, head_dim]: kernels::active_for(x's device) (a CUDA device by default; HF_DECODE_KERNELS=off
// keeps the operators), a kernel dtype, an even head_dim, cos and sin of x's dtype without gradients.
bool rotary_rows_apply(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

// x * cos + rotate_half(x) * sin for x [B, T, heads, head_dim] and cos, sin [B or 1, 1, T, head_dim]; differentiable
// in x. Returns [B, T, heads, head_dim].
torch::Tensor rotary_rows(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

}  // namespace hybridflow
