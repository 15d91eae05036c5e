// The launcher of few_rows_linear.cu on raw device pointers (plain CUDA without libtorch's headers, as
// cuda_launch.h's); few_rows_linear.cpp checks the tensors and calls it on the current stream. It returns nullptr,
// or the CUDA error's text when the launch failed.
#pragma once

#include <cstdint>

#include "kernels/cuda_launch.h"

namespace hybridflow::kernels::cuda {

// The lanes of a warp, which share an output's weight row, and how the kernel and its CPU reference split it:
// lane l takes the row's 16-byte vectors l, l + 32, l + 64, ... in turn.
constexpr int kFewRowsLanes = 32;

struct FewRowsLinear {
  const void* x;            // [rows, k]
  const void* weight[3];    // parts' weights [n[i], k]
  const void* bias[3];      // [n[i]] or nullptr
  void* out[3];             // [rows, n[i]] in the dtype, or float32 when float_out
  int64_t n[3];             // 0 past the parts used
  int64_t rows, k;
  bool float_out;
  // Two parts, gate and up, and one output: out[0] = swiglu(x weight[0]^T, x weight[1]^T), [rows, n[0]].
  bool swiglu;
};
const char* few_rows_linear(Dtype dtype, const FewRowsLinear& args, void* stream);

}  // namespace hybridflow::kernels::cuda
