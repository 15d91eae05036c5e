// Fused CPU decode steps; see fused_decode.h. The arithmetic follows transformer.cpp's operators (float32
// RMSNorm, rotate_half rotary, softmax(q.k * scale) v), so results agree with them to float rounding.
//
// Compiled with OpenMP (CMakeLists.txt): at::parallel_for is an inline OpenMP loop, serial without it.
#include "model/fused_decode.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace hybridflow::fused_decode {
namespace {

// Each parallel chunk of a projection reads at least this many weights (256 KB): smaller matrices run on
// one core, where waking the other would cost more than it saves.
constexpr int64_t kParallelWeights = 64 * 1024;

// ---- kernels: portable loops, and AVX2 + FMA versions chosen once when the CPU has them ----------------

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
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}
#endif

struct Kernels {
  float (*dot)(const float*, const float*, int64_t);
  void (*rows_dot)(const float*, int64_t, const float*, int64_t, int64_t, int64_t, int64_t, float*, int64_t);
  void (*axpy)(float*, float, const float*, int64_t);
};

const Kernels& kernels() {
  static const Kernels chosen = [] {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Kernels{dot_avx2, rows_dot_avx2, axpy_avx2};
#endif
    return Kernels{dot_portable, rows_dot_portable, axpy_portable};
  }();
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

// A weight matrix whose output features land at column `column` of a [rows, ldy] output.
struct Projection {
  const at::Tensor* weight;
  int64_t column;
};

// y[:, column + o] = x . weight[o]^T for each projection (stacked: one parallel loop over all their rows),
// x [rows, in] with row stride ldx. Few rows: the weight rows split over the cores; more: at::mm.
void project(const std::vector<Projection>& projections, const float* x, int64_t ldx, int64_t in, int64_t rows,
             float* y, int64_t ldy) {
  if (rows > kMaxVectorRows) {
    auto xt = at::from_blob(const_cast<float*>(x), {rows, in}, {ldx, 1}, at::kFloat);
    for (const Projection& p : projections) {
      const int64_t out = p.weight->size(0);
      at::from_blob(y + p.column, {rows, out}, {ldy, 1}, at::kFloat).copy_(at::mm(xt, p.weight->t()));
    }
    return;
  }
  int64_t total = 0;
  for (const Projection& p : projections) total += p.weight->size(0);
  const Kernels& k = kernels();
  at::parallel_for(0, total, std::max<int64_t>(1, kParallelWeights / in), [&](int64_t begin, int64_t end) {
    int64_t base = 0;
    for (const Projection& p : projections) {
      const int64_t out = p.weight->size(0);
      const int64_t lo = std::max(begin, base), hi = std::min(end, base + out);
      if (lo < hi) k.rows_dot(p.weight->data_ptr<float>(), in, x, ldx, rows, lo - base, hi - base, y + p.column, ldy);
      base += out;
    }
  });
}

void add_bias(float* y, int64_t rows, int64_t ldy, const at::Tensor& bias) {
  if (!bias.defined()) return;
  const float* b = bias.data_ptr<float>();
  const int64_t n = bias.numel();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) y[r * ldy + i] += b[i];
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
  const float* qkv;  // [rows, (heads + 2 kv_heads) head_dim]: q, then k, then v
  int64_t qkv_dim;
  const float* q_norm;
  const float* k_norm;
  float* keys;  // slabs [slots, kv_heads, capacity, head_dim]
  float* values;
  int64_t capacity;
  const int64_t* slots;
  const int64_t* lengths;
  const float* cos;  // [rows, head_dim]
  const float* sin;
  float* out;  // [rows, heads * head_dim]
};

// One row and one KV head: its key and value into the cache (normed, rotated), then its query heads'
// attention over the slot's positions.
void attend_unit(const AttentionArgs& a, int64_t r, int64_t g, std::vector<float>& scratch) {
  const Shape& s = *a.shape;
  const Kernels& k = kernels();
  const int64_t d = s.head_dim, q_dim = s.heads * d, kv_dim = s.kv_heads * d, group = s.heads / s.kv_heads;
  const int64_t pos = a.lengths[r];
  const int64_t first = s.sliding_window > 0 ? std::max<int64_t>(0, pos - s.sliding_window + 1) : 0;
  const int64_t span = pos - first + 1;
  scratch.resize(static_cast<size_t>(2 * d + span));
  float* head = scratch.data();
  float* rotated = head + d;
  float* scores = rotated + d;
  const float* cos = a.cos + r * d;
  const float* sin = a.sin + r * d;
  const int64_t slab_offset = (a.slots[r] * s.kv_heads + g) * a.capacity * d;
  float* keys = a.keys + slab_offset;
  float* values = a.values + slab_offset;
  const float* row = a.qkv + r * a.qkv_dim;

  const float* key = row + q_dim + g * d;
  if (a.k_norm != nullptr) {
    rms_norm_rows(key, 1, d, a.k_norm, s.eps, head);
    key = head;
  }
  rotate(key, cos, sin, d, keys + pos * d);
  std::copy_n(row + q_dim + kv_dim + g * d, d, values + pos * d);

  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int64_t j = 0; j < group; ++j) {
    const int64_t h = g * group + j;
    const float* query = row + h * d;
    if (a.q_norm != nullptr) {
      rms_norm_rows(query, 1, d, a.q_norm, s.eps, head);
      query = head;
    }
    rotate(query, cos, sin, d, rotated);
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t p = 0; p < span; ++p) {
      scores[p] = k.dot(rotated, keys + (first + p) * d, d) * scale;
      top = std::max(top, scores[p]);
    }
    float total = 0;
    for (int64_t p = 0; p < span; ++p) {
      scores[p] = std::exp(scores[p] - top);
      total += scores[p];
    }
    float* out = a.out + r * q_dim + h * d;
    std::fill_n(out, d, 0.0f);
    for (int64_t p = 0; p < span; ++p) k.axpy(out, scores[p] / total, values + (first + p) * d, d);
  }
}

void attend(const AttentionArgs& a, int64_t rows) {
  const Shape& s = *a.shape;
  int64_t longest = 0;
  for (int64_t r = 0; r < rows; ++r) longest = std::max(longest, a.lengths[r] + 1);
  // One unit reads about span x head_dim keys and values per query head of its group.
  const int64_t unit_work = std::max<int64_t>(1, (s.heads / s.kv_heads) * longest * s.head_dim * 2);
  at::parallel_for(0, rows * s.kv_heads, std::max<int64_t>(1, kParallelWeights / unit_work), [&](int64_t begin, int64_t end) {
    std::vector<float> scratch;
    for (int64_t u = begin; u < end; ++u) attend_unit(a, u / s.kv_heads, u % s.kv_heads, scratch);
  });
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

// act = silu(x . gate^T) * (x . up^T), the two products and the activation in one parallel loop.
void gated_mlp_input(const LayerWeights& w, const float* x, int64_t in, int64_t rows, int64_t ffn, float* gate,
                     float* up) {
  if (rows > kMaxVectorRows) {
    auto xt = at::from_blob(const_cast<float*>(x), {rows, in}, at::kFloat);
    auto g = at::from_blob(gate, {rows, ffn}, at::kFloat);
    g.copy_(at::mm(xt, w.gate.t()));
    at::silu_(g);
    g.mul_(at::mm(xt, w.up.t()));
    return;
  }
  const Kernels& k = kernels();
  at::parallel_for(0, ffn, std::max<int64_t>(1, kParallelWeights / (2 * in)), [&](int64_t begin, int64_t end) {
    k.rows_dot(w.gate.data_ptr<float>(), in, x, in, rows, begin, end, gate, ffn);
    k.rows_dot(w.up.data_ptr<float>(), in, x, in, rows, begin, end, up, ffn);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t f = begin; f < end; ++f) gate[r * ffn + f] = silu(gate[r * ffn + f]) * up[r * ffn + f];
  });
}

void add_rows(float* h, const float* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) h[i] += x[i];
}

bool float_cpu(const at::Tensor& t) {
  return !t.defined() || (t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous());
}

}  // namespace

bool supports(const at::Tensor& h, const std::vector<LayerWeights>& layers) {
  if (!h.defined() || !float_cpu(h)) return false;
  for (const LayerWeights& w : layers)
    for (const at::Tensor* t : {&w.input_norm, &w.post_norm, &w.q, &w.k, &w.v, &w.o, &w.q_bias, &w.k_bias, &w.v_bias,
                                &w.o_bias, &w.q_norm, &w.k_norm, &w.gate, &w.up, &w.down})
      if (!float_cpu(*t)) return false;
  return true;
}

void decode_layers(at::Tensor& h, const Shape& s, const std::vector<LayerWeights>& layers, std::vector<at::Tensor>& keys,
                   std::vector<at::Tensor>& values, const std::vector<int64_t>& slots, const std::vector<int64_t>& lengths,
                   const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t rows = h.size(0), hidden = s.hidden, d = s.head_dim;
  const int64_t q_dim = s.heads * d, kv_dim = s.kv_heads * d, qkv_dim = q_dim + 2 * kv_dim;
  std::vector<float> normed(static_cast<size_t>(rows * hidden)), qkv(static_cast<size_t>(rows * qkv_dim));
  std::vector<float> attention(static_cast<size_t>(rows * q_dim)), delta(static_cast<size_t>(rows * hidden));
  std::vector<float> gate(static_cast<size_t>(rows * s.ffn)), up(static_cast<size_t>(rows * s.ffn));
  float* x = h.data_ptr<float>();
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerWeights& w = layers[l];
    rms_norm_rows(x, rows, hidden, w.input_norm.data_ptr<float>(), s.eps, normed.data());
    project({{&w.q, 0}, {&w.k, q_dim}, {&w.v, q_dim + kv_dim}}, normed.data(), hidden, hidden, rows, qkv.data(), qkv_dim);
    add_bias(qkv.data(), rows, qkv_dim, w.q_bias);
    add_bias(qkv.data() + q_dim, rows, qkv_dim, w.k_bias);
    add_bias(qkv.data() + q_dim + kv_dim, rows, qkv_dim, w.v_bias);
    AttentionArgs args{&s,
                       qkv.data(),
                       qkv_dim,
                       data(w.q_norm),
                       data(w.k_norm),
                       keys[l].data_ptr<float>(),
                       values[l].data_ptr<float>(),
                       keys[l].size(2),
                       slots.data(),
                       lengths.data(),
                       cos.data_ptr<float>(),
                       sin.data_ptr<float>(),
                       attention.data()};
    attend(args, rows);
    project({{&w.o, 0}}, attention.data(), q_dim, q_dim, rows, delta.data(), hidden);
    add_bias(delta.data(), rows, hidden, w.o_bias);
    add_rows(x, delta.data(), rows * hidden);
    rms_norm_rows(x, rows, hidden, w.post_norm.data_ptr<float>(), s.eps, normed.data());
    gated_mlp_input(w, normed.data(), hidden, rows, s.ffn, gate.data(), up.data());
    project({{&w.down, 0}}, gate.data(), s.ffn, s.ffn, rows, delta.data(), hidden);
    add_rows(x, delta.data(), rows * hidden);
  }
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w) {
  const int64_t rows = x.size(0), in = x.size(1), out = w.size(0);
  auto y = at::empty({rows, out}, x.options());
  project({{&w, 0}}, x.data_ptr<float>(), in, in, rows, y.data_ptr<float>(), out);
  return y;
}

}  // namespace hybridflow::fused_decode
