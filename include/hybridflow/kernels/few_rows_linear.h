// A decode step's projections at a few rows as one weight-streaming kernel each (a GEMV with up to 8 rows).
//
// At batch 1 the decode step reads every weight once for one row: the step is bound by the weights' bytes, and
// libtorch's matrix multiply (cuBLAS) streamed them at 0.42 of an H200's copy bandwidth over a 1.7B step, one
// call per projection. Here a warp computes one output of every row: its 32 lanes read the output's weight row
// with 16-byte loads, each lane a strided share of it, multiply by the rows' inputs and sum in fp32, then the
// warp adds its lanes' sums by a butterfly. Several projections of one input (q, k and v) go in one launch, and
// a gated MLP's gate and up projections go in one launch that applies SwiGLU to the pair before storing it.
//
// Like decode_kernels.h, each function runs its CUDA kernel on CUDA tensors (a CUDA build) and its CPU
// reference on CPU tensors. The reference follows the kernel's order of arithmetic exactly (each lane's
// products and sums in turn, then the butterfly; the CUDA kernels compile with --fmad=false), so the two agree
// bit for bit and CI tests the kernel's arithmetic without a GPU. Against libtorch's matmul the results differ
// only by the order of the fp32 sum. Each output is rounded to the dtype once, after its bias, as a matmul
// stores it.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace hybridflow::kernels {

// The most rows the kernels take; past it a matmul reads each weight once for many rows and wins.
constexpr int64_t kFewRowsMax = 8;

// Whether the decode step's projections take these kernels where kernels::active_for (decode_kernels.h) sends
// the step through the fused kernels: HF_DECODE_GEMV=on or 1 in the environment; off, 0 or unset: libtorch's
// matmul (opt-in until a GPU run has measured them; another value is an error naming the variable).
bool few_rows_linear_enabled();
void set_few_rows_linear_enabled(bool on);

// Whether x [rows, k] times each weight [n, k] can run here: enabled, kernels::active_for(x's device), 1 to
// kFewRowsMax rows, x and every weight one dtype (fp32, fp16 or bf16) on one device, contiguous, 16-byte
// aligned and k a whole number of 16-byte vectors. (The functions below check only the shapes and dtypes: a
// caller that has decided may call them regardless of the switch.)
bool few_rows_linear_applies(const torch::Tensor& x, std::initializer_list<torch::Tensor> weights);

// outputs[i] = x weights[i]^T + biases[i] for one to three weights of one input, in one launch: x [rows, k],
// weights[i] [n_i, k], biases empty or one per weight (each [n_i] or undefined). Each output is [rows, n_i] in
// x's dtype, or float32 holding the dtype's values when `float_out` (the head's logits, which decoding reads in
// float32).
std::vector<torch::Tensor> few_rows_linear(const torch::Tensor& x, const std::vector<torch::Tensor>& weights,
                                           const std::vector<torch::Tensor>& biases = {}, bool float_out = false);

// A gated MLP's features in one launch: swiglu(x gate^T, x up^T) (kernels::swiglu of the two projections, each
// rounded to the dtype first, as the unfused steps store them): x [rows, k], gate and up [n, k]; [rows, n].
torch::Tensor few_rows_swiglu(const torch::Tensor& x, const torch::Tensor& gate, const torch::Tensor& up);

}  // namespace hybridflow::kernels
