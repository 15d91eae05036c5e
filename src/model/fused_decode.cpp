// Fused CPU decode steps; see fused_decode.h. The arithmetic follows transformer.cpp's operators (float32
// RMSNorm, rotate_half rotary, softmax(q.k * scale) v), so results agree with them to float rounding.
//
// Compiled with OpenMP (CMakeLists.txt): at::parallel_for is an inline OpenMP loop, serial without it.
#include "model/fused_decode.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

namespace hybridflow::fused_decode {
namespace {

// Each parallel chunk of a projection reads at least this many weights (256 KB): smaller matrices run on
// one core, where waking the other would cost more than it saves.
constexpr int64_t kParallelWeights = 64 * 1024;

// ---- kernels: portable loops, AVX2 + FMA and AVX-512 versions, the best the CPU has chosen once --------

float dot_portable(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// y[r * ldy + o] = w[o, :] . x[r, :] for output features o in [o0, o1) and rows r in [0, rows).
void rows_dot_portable(const float* w, int64_t in, const float* x, int64_t ldx, int64_t rows, int64_t o0, int64_t o1,
                       float* y, int64_t ldy) {
  for (int64_t o = o0; o < o1; ++o)
    for (int64_t r = 0; r < rows; ++r) y[r * ldy + o] = dot_portable(w + o * in, x + r * ldx, in);
}

void axpy_portable(float* y, float a, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) inline float hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float sum = hsum_avx2(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

__attribute__((target("avx2,fma"))) void rows_dot_avx2(const float* w, int64_t in, const float* x, int64_t ldx,
                                                       int64_t rows, int64_t o0, int64_t o1, float* y, int64_t ldy) {
  for (int64_t o = o0; o < o1; ++o) {
    const float* wr = w + o * in;
    if (rows == 1) {
      // One row: four independent chains so the loads, not the FMA latency, set the pace.
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
      int64_t i = 0;
      for (; i + 32 <= in; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i + 24), _mm256_loadu_ps(x + i + 24), a3);
      }
      for (; i + 8 <= in; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i), _mm256_loadu_ps(x + i), a0);
      float sum = hsum_avx2(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
      for (; i < in; ++i) sum += wr[i] * x[i];
      y[o] = sum;
      continue;
    }
    int64_t r = 0;
    // Four rows share each load of the weight row (it stays in L1 for the rest).
    for (; r + 4 <= rows; r += 4) {
      const float* x0 = x + r * ldx;
      const float* x1 = x0 + ldx;
      const float* x2 = x1 + ldx;
      const float* x3 = x2 + ldx;
      __m256 a0 = _mm256_setzero_ps(), b0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
      __m256 a2 = _mm256_setzero_ps(), b2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps(), b3 = _mm256_setzero_ps();
      int64_t i = 0;
      for (; i + 16 <= in; i += 16) {
        const __m256 w0 = _mm256_loadu_ps(wr + i), w1 = _mm256_loadu_ps(wr + i + 8);
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + i), a0);
        b0 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x0 + i + 8), b0);
        a1 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x1 + i), a1);
        b1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x1 + i + 8), b1);
        a2 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x2 + i), a2);
        b2 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x2 + i + 8), b2);
        a3 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x3 + i), a3);
        b3 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x3 + i + 8), b3);
      }
      for (; i + 8 <= in; i += 8) {
        const __m256 w0 = _mm256_loadu_ps(wr + i);
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + i), a0);
        a1 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x1 + i), a1);
        a2 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x2 + i), a2);
        a3 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x3 + i), a3);
      }
      float s0 = hsum_avx2(_mm256_add_ps(a0, b0)), s1 = hsum_avx2(_mm256_add_ps(a1, b1));
      float s2 = hsum_avx2(_mm256_add_ps(a2, b2)), s3 = hsum_avx2(_mm256_add_ps(a3, b3));
      for (; i < in; ++i) {
        s0 += wr[i] * x0[i];
        s1 += wr[i] * x1[i];
        s2 += wr[i] * x2[i];
        s3 += wr[i] * x3[i];
      }
      y[r * ldy + o] = s0;
      y[(r + 1) * ldy + o] = s1;
      y[(r + 2) * ldy + o] = s2;
      y[(r + 3) * ldy + o] = s3;
    }
    for (; r < rows; ++r) y[r * ldy + o] = dot_avx2(wr, x + r * ldx, in);
  }
}

__attribute__((target("avx2,fma"))) void axpy_avx2(float* y, float a, const float* x, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

// AVX-512: R rows and O output features per pass over `in`, so each 16-float weight load feeds all R rows and
// each row load all O features (R * O accumulators, at most 24 of the 32 registers). Every (row, feature)
// sums in one 16-lane chain with a masked tail, the same for any R and O: a row's result does not depend on
// how many rows share its step nor on how the features are split over threads. The chains' latency is no
// limit here: at a few rows the weights stream from memory far slower than the FMAs retire.
// GCC 12's reduction and lane-extract intrinsics warn of an uninitialized operand inside its own header, so the
// halves go through memory (once per output feature: nothing next to the pass over the weights).
__attribute__((target("avx512f,avx2,fma"))) inline float hsum_avx512(__m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  return hsum_avx2(_mm256_add_ps(_mm256_load_ps(lanes), _mm256_load_ps(lanes + 8)));
}

template <int R, int O>
__attribute__((target("avx512f,avx2,fma"))) inline void rows_dot_avx512_block(const float* w, int64_t in, const float* x,
                                                                      int64_t ldx, float* y, int64_t ldy) {
  __m512 acc[R][O];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < O; ++j) acc[r][j] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= in; i += 16) {
    // Each row's 16 inputs are loaded once into a register and feed all O outputs. Left to itself GCC folds
    // the load into every multiply-add, loading each of them O times; at 8 rows that costs 12-17% of the
    // pass (measured on this project's 2-core Xeon). The empty asm keeps the value in its register.
    __m512 xv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      xv[r] = _mm512_loadu_ps(x + r * ldx + i);
      __asm__("" : "+v"(xv[r]));
    }
#pragma GCC unroll 4
    for (int j = 0; j < O; ++j) {
      const __m512 wv = _mm512_loadu_ps(w + j * in + i);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][j] = _mm512_fmadd_ps(wv, xv[r], acc[r][j]);
    }
  }
  if (i < in) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (in - i)) - 1u);
    __m512 wv[O];
#pragma GCC unroll 4
    for (int j = 0; j < O; ++j) wv[j] = _mm512_maskz_loadu_ps(tail, w + j * in + i);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_maskz_loadu_ps(tail, x + r * ldx + i);
#pragma GCC unroll 4
      for (int j = 0; j < O; ++j) acc[r][j] = _mm512_fmadd_ps(wv[j], xv, acc[r][j]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < O; ++j) y[r * ldy + j] = hsum_avx512(acc[r][j]);
}

template <int R>
__attribute__((target("avx512f,avx2,fma"))) void rows_dot_avx512_rows(const float* w, int64_t in, const float* x, int64_t ldx,
                                                              int64_t o0, int64_t o1, float* y, int64_t ldy) {
  constexpr int O = R <= 4 ? 4 : 3;
  int64_t o = o0;
  for (; o + O <= o1; o += O) rows_dot_avx512_block<R, O>(w + o * in, in, x, ldx, y + o, ldy);
  for (; o < o1; ++o) rows_dot_avx512_block<R, 1>(w + o * in, in, x, ldx, y + o, ldy);
}

__attribute__((target("avx512f,avx2,fma"))) void rows_dot_avx512(const float* w, int64_t in, const float* x, int64_t ldx,
                                                         int64_t rows, int64_t o0, int64_t o1, float* y, int64_t ldy) {
  for (int64_t r = 0; r < rows; r += 8) {
    const float* xr = x + r * ldx;
    float* yr = y + r * ldy;
    switch (std::min<int64_t>(8, rows - r)) {
      case 1: rows_dot_avx512_rows<1>(w, in, xr, ldx, o0, o1, yr, ldy); break;
      case 2: rows_dot_avx512_rows<2>(w, in, xr, ldx, o0, o1, yr, ldy); break;
      case 3: rows_dot_avx512_rows<3>(w, in, xr, ldx, o0, o1, yr, ldy); break;
      case 4: rows_dot_avx512_rows<4>(w, in, xr, ldx, o0, o1, yr, ldy); break;
      case 5: rows_dot_avx512_rows<5>(w, in, xr, ldx, o0, o1, yr, ldy); break;
      case 6: rows_dot_avx512_rows<6>(w, in, xr, ldx, o0, o1, yr, ldy); break;
      case 7: rows_dot_avx512_rows<7>(w, in, xr, ldx, o0, o1, yr, ldy); break;
      default: rows_dot_avx512_rows<8>(w, in, xr, ldx, o0, o1, yr, ldy); break;
    }
  }
}

bool cpu_has_avx512() { return __builtin_cpu_supports("avx512f"); }
bool cpu_has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#else
bool cpu_has_avx512() { return false; }
bool cpu_has_avx2() { return false; }
#endif

struct Kernels {
  float (*dot)(const float*, const float*, int64_t);
  void (*rows_dot)(const float*, int64_t, const float*, int64_t, int64_t, int64_t, int64_t, float*, int64_t);
  void (*axpy)(float*, float, const float*, int64_t);
};

Isa best_isa() {
  if (cpu_has_avx512()) return Isa::avx512;
  if (cpu_has_avx2()) return Isa::avx2;
  return Isa::portable;
}

// The kernels of `isa`, which the CPU must have. AVX-512 is the few-rows kernel only: the dots and axpys of
// attention and the norms are a few head_dim-long vectors each, where AVX2 already keeps up.
Kernels kernels_of(Isa isa) {
#if defined(__x86_64__)
  if (isa == Isa::avx512) return Kernels{dot_avx2, rows_dot_avx512, axpy_avx2};
  if (isa == Isa::avx2) return Kernels{dot_avx2, rows_dot_avx2, axpy_avx2};
#endif
  return Kernels{dot_portable, rows_dot_portable, axpy_portable};
}

const Kernels& kernels() {
  static const Kernels chosen = kernels_of(best_isa());
  return chosen;
}

const float* data(const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

// ---- the steps of a layer ------------------------------------------------------------------------------

// out[r] = weight * (x[r] / rms(x[r])), as transformer.cpp's rms_norm in float32.
void rms_norm_rows(const float* x, int64_t rows, int64_t n, const float* weight, double eps, float* out) {
  const Kernels& k = kernels();
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    const float mean_square = k.dot(xr, xr, n) / static_cast<float>(n);
    const float scale = 1.0f / std::sqrt(mean_square + static_cast<float>(eps));
    for (int64_t i = 0; i < n; ++i) out[r * n + i] = weight[i] * (xr[i] * scale);
  }
}

// x[i] cos[i] + rotate_half(x)[i] sin[i], rotate_half(x) = (-x[half:], x[:half]).
void rotate(const float* x, const float* cos, const float* sin, int64_t d, float* out) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    out[i] = x[i] * cos[i] + (-x[i + half]) * sin[i];
    out[i + half] = x[i + half] * cos[i + half] + x[i] * sin[i + half];
  }
}

struct AttentionArgs {
  const Shape* shape;
  // Row r's query heads at q + r * q_stride, its new key and value heads at k / v + r * kv_stride.
  const float* q;
  const float* k;
  const float* v;
  int64_t q_stride, kv_stride;
  const float* q_norm;
  const float* k_norm;
  float* keys;  // pools [blocks, kv_heads, block_size, head_dim]
  float* values;
  BlockTables tables;
  const int64_t* lengths;
  const float* cos;  // [rows, head_dim]
  const float* sin;
  float* out;  // [rows, heads * head_dim]
};

// Row r's position p of KV head g in a pool (see BlockTables).
float* cache_row(float* pool, const AttentionArgs& a, int64_t r, int64_t g, int64_t p) {
  const BlockTables& t = a.tables;
  const int64_t block = t.ids[r * t.width + p / t.block_size];
  return pool + ((block * a.shape->kv_heads + g) * t.block_size + p % t.block_size) * a.shape->head_dim;
}

// One row and one KV head: its key and value into the cache (normed, rotated), then its query heads'
// attention over the sequence's positions, each found once through its block table.
void attend_unit(const AttentionArgs& a, int64_t r, int64_t g, std::vector<float>& scratch,
                 std::vector<const float*>& rows) {
  const Shape& s = *a.shape;
  const Kernels& k = kernels();
  const int64_t d = s.head_dim, q_dim = s.heads * d, group = s.heads / s.kv_heads;
  const int64_t pos = a.lengths[r];
  const int64_t first = s.sliding_window > 0 ? std::max<int64_t>(0, pos - s.sliding_window + 1) : 0;
  const int64_t span = pos - first + 1;
  scratch.resize(static_cast<size_t>(2 * d + span));
  float* head = scratch.data();
  float* rotated = head + d;
  float* scores = rotated + d;
  const float* cos = a.cos + r * d;
  const float* sin = a.sin + r * d;
  const float* key = a.k + r * a.kv_stride + g * d;
  if (a.k_norm != nullptr) {
    rms_norm_rows(key, 1, d, a.k_norm, s.eps, head);
    key = head;
  }
  rotate(key, cos, sin, d, cache_row(a.keys, a, r, g, pos));
  std::copy_n(a.v + r * a.kv_stride + g * d, d, cache_row(a.values, a, r, g, pos));
  // The span's key rows, then its value rows: consecutive within a block.
  rows.resize(static_cast<size_t>(2 * span));
  const float** key_rows = rows.data();
  const float** value_rows = key_rows + span;
  for (int64_t p = 0; p < span;) {
    const float* key_row = cache_row(a.keys, a, r, g, first + p);
    const float* value_row = cache_row(a.values, a, r, g, first + p);
    const int64_t run = std::min(span - p, a.tables.block_size - (first + p) % a.tables.block_size);
    for (int64_t i = 0; i < run; ++i, ++p) {
      key_rows[p] = key_row + i * d;
      value_rows[p] = value_row + i * d;
    }
  }

  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int64_t j = 0; j < group; ++j) {
    const int64_t h = g * group + j;
    const float* query = a.q + r * a.q_stride + h * d;
    if (a.q_norm != nullptr) {
      rms_norm_rows(query, 1, d, a.q_norm, s.eps, head);
      query = head;
    }
    rotate(query, cos, sin, d, rotated);
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t p = 0; p < span; ++p) {
      scores[p] = k.dot(rotated, key_rows[p], d) * scale;
      top = std::max(top, scores[p]);
    }
    float total = 0;
    for (int64_t p = 0; p < span; ++p) {
      scores[p] = std::exp(scores[p] - top);
      total += scores[p];
    }
    float* out = a.out + r * q_dim + h * d;
    std::fill_n(out, d, 0.0f);
    for (int64_t p = 0; p < span; ++p) k.axpy(out, scores[p] / total, value_rows[p], d);
  }
}

void attend(const AttentionArgs& a, int64_t rows) {
  const Shape& s = *a.shape;
  int64_t longest = 0;
  for (int64_t r = 0; r < rows; ++r) longest = std::max(longest, a.lengths[r] + 1);
  // One unit reads about span x head_dim keys and values per query head of its group.
  const int64_t unit_work = std::max<int64_t>(1, (s.heads / s.kv_heads) * longest * s.head_dim * 2);
  at::parallel_for(0, rows * s.kv_heads, std::max<int64_t>(1, kParallelWeights / unit_work),
                   [&](int64_t begin, int64_t end) {
                     std::vector<float> scratch;
                     std::vector<const float*> rows;
                     for (int64_t u = begin; u < end; ++u)
                       attend_unit(a, u / s.kv_heads, u % s.kv_heads, scratch, rows);
                   });
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

bool float_cpu(const at::Tensor& t) {
  return !t.defined() || (t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous());
}

// A barrier for the threads of one OpenMP team: a decode step at a few rows crosses five per layer,
// microseconds apart, and OpenMP's own barrier or a new parallel region costs a futex wake each under
// OMP_WAIT_POLICY=passive (what the trainer's workers and scripts/bench.sh set). So a waiter spins briefly,
// which covers the usual imbalance between the threads' shares, and then sleeps on the generation word
// (C++20 atomic wait: a futex), so that on a loaded machine it hands its core to the thread it waits for
// instead of asking for it back with sched_yield in a loop. The last thread to arrive wakes the sleepers;
// that costs a system call only when one sleeps.
class SpinBarrier {
 public:
  explicit SpinBarrier(int threads) : threads_(threads) {}
  void wait() {
    if (threads_ == 1) return;
    const int generation = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == threads_) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.store(generation + 1, std::memory_order_release);
      generation_.notify_all();
      return;
    }
    for (int spins = 0; spins < kSpins; ++spins)
      if (generation_.load(std::memory_order_acquire) != generation) return;
    while (generation_.load(std::memory_order_acquire) == generation) generation_.wait(generation);
  }

 private:
  static constexpr int kSpins = 4096;
  const int threads_;
  std::atomic<int> arrived_{0};
  std::atomic<int> generation_{0};
};

// [begin, end) of n items for thread `tid` of `threads`.
std::pair<int64_t, int64_t> share(int64_t n, int tid, int threads) {
  return {n * tid / threads, n * (tid + 1) / threads};
}

// Few rows: one parallel region for the whole step. Every thread computes the (cheap) norms itself and its
// share of each matrix's output features, of the attention units and of the residual update, with a
// SpinBarrier between the phases that need the others' results.
void decode_layers_few_rows(float* x, int64_t rows, const Shape& s, const std::vector<LayerWeights>& layers,
                            std::vector<at::Tensor>& keys, std::vector<at::Tensor>& values, const BlockTables& tables,
                            const int64_t* lengths, const float* cos, const float* sin) {
  const int64_t hidden = s.hidden, d = s.head_dim, ffn = s.ffn;
  const int64_t q_dim = s.heads * d, kv_dim = s.kv_heads * d, qkv_dim = q_dim + 2 * kv_dim;
  std::vector<float> qkv(static_cast<size_t>(rows * qkv_dim)), attention(static_cast<size_t>(rows * q_dim));
  std::vector<float> delta(static_cast<size_t>(rows * hidden));
  std::vector<float> gate(static_cast<size_t>(rows * ffn)), up(static_cast<size_t>(rows * ffn));
  // Small layers are not worth a second thread: each needs a few hundred KB of weights per thread.
  const int64_t layer_weights = (qkv_dim + q_dim) * hidden + 3 * hidden * ffn;
  int threads = static_cast<int>(
      std::min<int64_t>(at::get_num_threads(), std::max<int64_t>(1, layer_weights / (4 * kParallelWeights))));
#ifdef _OPENMP
  if (omp_in_parallel()) threads = 1;
#else
  threads = 1;
#endif
  const Kernels& k = kernels();
  SpinBarrier barrier(threads);
  auto team = [&](int tid) {
    std::vector<float> normed(static_cast<size_t>(rows * hidden)), scratch;
    std::vector<const float*> cache_rows;
    const auto [qkv_lo, qkv_hi] = share(qkv_dim, tid, threads);
    const auto [hid_lo, hid_hi] = share(hidden, tid, threads);
    const auto [ffn_lo, ffn_hi] = share(ffn, tid, threads);
    const auto [unit_lo, unit_hi] = share(rows * s.kv_heads, tid, threads);
    for (size_t l = 0; l < layers.size(); ++l) {
      const LayerWeights& w = layers[l];
      rms_norm_rows(x, rows, hidden, w.input_norm.data_ptr<float>(), s.eps, normed.data());
      // This thread's rows of [q; k; v] (each row of the stack belongs to one of the three).
      const at::Tensor* stack[3] = {&w.q, &w.k, &w.v};
      const at::Tensor* biases[3] = {&w.q_bias, &w.k_bias, &w.v_bias};
      for (int64_t part = 0, base = 0; part < 3; base += stack[part]->size(0), ++part) {
        const int64_t lo = std::max(qkv_lo, base), hi = std::min(qkv_hi, base + stack[part]->size(0));
        if (lo >= hi) continue;
        k.rows_dot(stack[part]->data_ptr<float>(), hidden, normed.data(), hidden, rows, lo - base, hi - base,
                   qkv.data() + base, qkv_dim);
        if (biases[part]->defined()) {
          const float* b = biases[part]->data_ptr<float>();
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t o = lo; o < hi; ++o) qkv[static_cast<size_t>(r * qkv_dim + o)] += b[o - base];
        }
      }
      barrier.wait();
      AttentionArgs args{&s,
                         qkv.data(),
                         qkv.data() + q_dim,
                         qkv.data() + q_dim + kv_dim,
                         qkv_dim,
                         qkv_dim,
                         data(w.q_norm),
                         data(w.k_norm),
                         keys[l].data_ptr<float>(),
                         values[l].data_ptr<float>(),
                         tables,
                         lengths,
                         cos,
                         sin,
                         attention.data()};
      for (int64_t u = unit_lo; u < unit_hi; ++u)
        attend_unit(args, u / s.kv_heads, u % s.kv_heads, scratch, cache_rows);
      barrier.wait();
      k.rows_dot(w.o.data_ptr<float>(), q_dim, attention.data(), q_dim, rows, hid_lo, hid_hi, delta.data(), hidden);
      const float* o_bias = data(w.o_bias);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = hid_lo; o < hid_hi; ++o)
          x[r * hidden + o] += delta[static_cast<size_t>(r * hidden + o)] + (o_bias != nullptr ? o_bias[o] : 0.0f);
      barrier.wait();
      rms_norm_rows(x, rows, hidden, w.post_norm.data_ptr<float>(), s.eps, normed.data());
      k.rows_dot(w.gate.data_ptr<float>(), hidden, normed.data(), hidden, rows, ffn_lo, ffn_hi, gate.data(), ffn);
      k.rows_dot(w.up.data_ptr<float>(), hidden, normed.data(), hidden, rows, ffn_lo, ffn_hi, up.data(), ffn);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t f = ffn_lo; f < ffn_hi; ++f) {
          const size_t i = static_cast<size_t>(r * ffn + f);
          gate[i] = silu(gate[i]) * up[i];
        }
      barrier.wait();
      k.rows_dot(w.down.data_ptr<float>(), ffn, gate.data(), ffn, rows, hid_lo, hid_hi, delta.data(), hidden);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = hid_lo; o < hid_hi; ++o) x[r * hidden + o] += delta[static_cast<size_t>(r * hidden + o)];
      barrier.wait();
    }
  };
  if (threads == 1) {
    team(0);
    return;
  }
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
  team(omp_get_thread_num());
#endif
}

}  // namespace

bool supports(const at::Tensor& h, const Shape& s, const std::vector<LayerWeights>& layers) {
  if (!h.defined() || !float_cpu(h) || h.dim() != 2 || h.size(1) != s.hidden) return false;
  const int64_t q_dim = s.heads * s.head_dim, kv_dim = s.kv_heads * s.head_dim;
  auto has = [](const at::Tensor& t, std::initializer_list<int64_t> sizes) {
    return float_cpu(t) && (!t.defined() || t.sizes().equals(sizes));
  };
  for (const LayerWeights& w : layers) {
    const bool fits = w.input_norm.defined() && w.post_norm.defined() && w.q.defined() && w.k.defined() &&
                      w.v.defined() && w.o.defined() && w.gate.defined() && w.up.defined() && w.down.defined() &&
                      has(w.input_norm, {s.hidden}) && has(w.post_norm, {s.hidden}) && has(w.q, {q_dim, s.hidden}) &&
                      has(w.k, {kv_dim, s.hidden}) && has(w.v, {kv_dim, s.hidden}) && has(w.o, {s.hidden, q_dim}) &&
                      has(w.q_bias, {q_dim}) && has(w.k_bias, {kv_dim}) && has(w.v_bias, {kv_dim}) &&
                      has(w.o_bias, {s.hidden}) && has(w.q_norm, {s.head_dim}) && has(w.k_norm, {s.head_dim}) &&
                      has(w.gate, {s.ffn, s.hidden}) && has(w.up, {s.ffn, s.hidden}) && has(w.down, {s.hidden, s.ffn});
    if (!fits) return false;
  }
  return true;
}

void decode_layers(at::Tensor& h, const Shape& s, const std::vector<LayerWeights>& layers,
                   std::vector<at::Tensor>& keys, std::vector<at::Tensor>& values, const BlockTables& tables,
                   const std::vector<int64_t>& lengths, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t rows = h.size(0), hidden = s.hidden, d = s.head_dim;
  if (rows <= kMaxVectorRows) {
    decode_layers_few_rows(h.data_ptr<float>(), rows, s, layers, keys, values, tables, lengths.data(),
                           cos.data_ptr<float>(), sin.data_ptr<float>());
    return;
  }
  // Many rows: the projections are matrix multiplies (at::mm / addmm, into contiguous tensors); norms,
  // rotary, the cache and attention stay fused.
  const int64_t q_dim = s.heads * d;
  auto normed = at::empty({rows, hidden}, h.options());
  auto attention = at::empty({rows, q_dim}, h.options());
  auto project = [](const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
    return bias.defined() ? at::addmm(bias, x, w.t()) : at::mm(x, w.t());
  };
  auto norm = [&](const at::Tensor& weight) {
    const float* src = h.data_ptr<float>();
    float* dst = normed.data_ptr<float>();
    at::parallel_for(0, rows, std::max<int64_t>(1, kParallelWeights / hidden), [&](int64_t begin, int64_t end) {
      rms_norm_rows(src + begin * hidden, end - begin, hidden, weight.data_ptr<float>(), s.eps, dst + begin * hidden);
    });
  };
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerWeights& w = layers[l];
    norm(w.input_norm);
    const auto q = project(normed, w.q, w.q_bias), k = project(normed, w.k, w.k_bias),
               v = project(normed, w.v, w.v_bias);
    AttentionArgs args{&s,
                       q.data_ptr<float>(),
                       k.data_ptr<float>(),
                       v.data_ptr<float>(),
                       q_dim,
                       k.size(1),
                       data(w.q_norm),
                       data(w.k_norm),
                       keys[l].data_ptr<float>(),
                       values[l].data_ptr<float>(),
                       tables,
                       lengths.data(),
                       cos.data_ptr<float>(),
                       sin.data_ptr<float>(),
                       attention.data_ptr<float>()};
    attend(args, rows);
    h.addmm_(attention, w.o.t());
    if (w.o_bias.defined()) h.add_(w.o_bias);
    norm(w.post_norm);
    auto gate = at::mm(normed, w.gate.t());
    at::silu_(gate);
    gate.mul_(at::mm(normed, w.up.t()));
    h.addmm_(gate, w.down.t());
  }
}

Isa selected_isa() { return best_isa(); }

bool rows_dot_with(Isa isa, const float* w, int64_t in, const float* x, int64_t ldx, int64_t rows, int64_t o0,
                   int64_t o1, float* y, int64_t ldy) {
  if ((isa == Isa::avx512 && !cpu_has_avx512()) || (isa == Isa::avx2 && !cpu_has_avx2())) return false;
  kernels_of(isa).rows_dot(w, in, x, ldx, rows, o0, o1, y, ldy);
  return true;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w) {
  const int64_t rows = x.size(0), in = x.size(1), out = w.size(0);
  if (rows > kMaxVectorRows) return at::mm(x, w.t());
  auto y = at::empty({rows, out}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const Kernels& k = kernels();
  at::parallel_for(0, out, std::max<int64_t>(1, kParallelWeights / in),
                   [&](int64_t begin, int64_t end) { k.rows_dot(wp, in, xp, in, rows, begin, end, yp, out); });
  return y;
}

}  // namespace hybridflow::fused_decode
