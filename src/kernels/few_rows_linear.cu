// The few-rows projection kernel of few_rows_launch.h on CUDA (what it computes: hybridflow/kernels/
// few_rows_linear.h). Plain CUDA, no libtorch; compiled with --fmad=false like decode_kernels.cu, so each product
// and sum rounds as the CPU reference's (few_rows_linear.cpp) do, in the same order.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda_convert.cuh"
#include "kernels/element_math.h"
#include "kernels/few_rows_launch.h"

namespace hybridflow::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
// 16-byte loads a lane issues before it multiplies: enough bytes in flight to cover the memory's latency at one
// row, few enough registers at eight rows with SwiGLU's two weights.
constexpr int kLoadsInFlight = 4;

// The part an output column belongs to, found with constant indices into the launch's arrays (an index known only
// at run time would copy the kernel's parameters to local memory).
struct Column {
  const void* weight;
  const void* bias;
  void* out;
  int64_t n, o;  // the part's columns, and this column within them
};

__device__ __forceinline__ bool find_column(const FewRowsLinear& a, int64_t o, Column& c) {
  if (o < a.n[0]) {
    c = {a.weight[0], a.bias[0], a.out[0], a.n[0], o};
    return true;
  }
  o -= a.n[0];
  if (o < a.n[1]) {
    c = {a.weight[1], a.bias[1], a.out[1], a.n[1], o};
    return true;
  }
  o -= a.n[1];
  if (o < a.n[2]) {
    c = {a.weight[2], a.bias[2], a.out[2], a.n[2], o};
    return true;
  }
  return false;
}

template <typename T>
__device__ __forceinline__ void unpack(const uint4& v, float* out) {
  constexpr int kVec = 16 / sizeof(T);
  const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
  for (int j = 0; j < kVec; ++j) out[j] = to_float(e[j]);
}

// A warp per output column o of every row (the columns of the parts one after another; with kSwiglu the gate's,
// the up projection's read beside it). Lane l sums over its vectors in turn, each vector's elements in order,
// acc = acc + w * x; the butterfly then adds the lanes (every lane ends with the same sum: a + b == b + a), and
// lane r stores row r's output. R: the rows rounded up to 1, 2, 4 or 8 (registers sized at compile time).
template <typename T, int R, bool kSwiglu>
__global__ void __launch_bounds__(kFewRowsLanes* kWarpsPerBlock) few_rows_kernel(FewRowsLinear a) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  const int lane = static_cast<int>(threadIdx.x) % kFewRowsLanes;
  const int64_t column = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kFewRowsLanes;
  Column c;
  if (kSwiglu) {
    if (column >= a.n[0]) return;
    c = {a.weight[0], nullptr, a.out[0], a.n[0], column};
  } else if (!find_column(a, column, c)) {
    return;
  }
  const int64_t o = c.o;
  const int64_t vectors = a.k / kVec;
  const uint4* w = reinterpret_cast<const uint4*>(static_cast<const T*>(c.weight) + o * a.k);
  const uint4* w_up = kSwiglu ? reinterpret_cast<const uint4*>(static_cast<const T*>(a.weight[1]) + o * a.k) : w;
  const uint4* x = reinterpret_cast<const uint4*>(a.x);
  float acc[R], acc_up[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = acc_up[r] = 0.0f;
  for (int64_t base = lane; base < vectors; base += kFewRowsLanes * kLoadsInFlight) {
    uint4 wv[kLoadsInFlight], wv_up[kLoadsInFlight];
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int64_t c = base + u * kFewRowsLanes;
      if (c < vectors) {
        wv[u] = __ldg(w + c);
        if (kSwiglu) wv_up[u] = __ldg(w_up + c);
      }
    }
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int64_t c = base + u * kFewRowsLanes;
      if (c >= vectors) break;
      float wf[kVec], wf_up[kVec];
      unpack<T>(wv[u], wf);
      if (kSwiglu) unpack<T>(wv_up[u], wf_up);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r < a.rows) {
          float xf[kVec];
          unpack<T>(__ldg(x + r * vectors + c), xf);
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            acc[r] = acc[r] + wf[j] * xf[j];
            if (kSwiglu) acc_up[r] = acc_up[r] + wf_up[j] * xf[j];
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int offset = kFewRowsLanes / 2; offset > 0; offset /= 2) {
      acc[r] = acc[r] + __shfl_xor_sync(0xffffffffu, acc[r], offset);
      if (kSwiglu) acc_up[r] = acc_up[r] + __shfl_xor_sync(0xffffffffu, acc_up[r], offset);
    }
  }
  const RoundTo<T> round;
  const int64_t n = c.n;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (lane != r || r >= a.rows) continue;
    float value;
    if (kSwiglu) {
      value = math::swiglu_element(round(acc[r]), round(acc_up[r]), round);
    } else {
      value = acc[r];
      if (c.bias != nullptr) value = value + to_float(static_cast<const T*>(c.bias)[o]);
      value = round(value);
    }
    if (a.float_out)
      static_cast<float*>(c.out)[r * n + o] = value;
    else
      static_cast<T*>(c.out)[r * n + o] = from_float<T>(value);
  }
}

template <typename T, int R>
void launch_rows(const FewRowsLinear& a, cudaStream_t stream) {
  const int64_t columns = a.swiglu ? a.n[0] : a.n[0] + a.n[1] + a.n[2];
  const auto blocks = static_cast<unsigned>((columns + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const unsigned threads = kFewRowsLanes * kWarpsPerBlock;
  if (a.swiglu)
    few_rows_kernel<T, R, true><<<blocks, threads, 0, stream>>>(a);
  else
    few_rows_kernel<T, R, false><<<blocks, threads, 0, stream>>>(a);
}

template <typename T>
void launch(const FewRowsLinear& a, cudaStream_t stream) {
  if (a.rows == 1)
    launch_rows<T, 1>(a, stream);
  else if (a.rows == 2)
    launch_rows<T, 2>(a, stream);
  else if (a.rows <= 4)
    launch_rows<T, 4>(a, stream);
  else
    launch_rows<T, 8>(a, stream);
}

}  // namespace

const char* few_rows_linear(Dtype dtype, const FewRowsLinear& args, void* stream) {
  if (args.rows < 1 || args.rows > 8) return "few_rows_linear takes 1 to 8 rows";
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case Dtype::kFloat32: launch<float>(args, s); break;
    case Dtype::kFloat16: launch<__half>(args, s); break;
    case Dtype::kBFloat16: launch<__nv_bfloat16>(args, s); break;
  }
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace hybridflow::kernels::cuda
