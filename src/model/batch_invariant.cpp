// Batch-invariant kernels; see model/batch_invariant.h. Every reduction here has one order, fixed by the
// code and not by the data's shape: a value computed for a token in a decode step equals the value computed
// for it in a prefill or in a training micro-batch because the same function computes it from equal inputs.
//
// Compiled with OpenMP (CMakeLists.txt) so that at::parallel_for splits the work; each output element is
// computed by one thread, so the split does not change any result. CUDA tensors take the CUDA kernels of
// kernels/batch_invariant_kernels.h through the same entry points (bi_forward_layers_cuda for the decoder).
#include "hybridflow/model/batch_invariant.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "hybridflow/core/error.h"
#include "hybridflow/kernels/batch_invariant_kernels.h"
#include "hybridflow/model/rotary.h"
#include "model/batch_invariant_layers.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace hybridflow {
namespace {

thread_local bool batch_invariant_on = false;

constexpr const char* kKey = "actor_rollout_ref.rollout.batch_invariant";

// ---- the dot product: the one reduction order of every matrix product ----------------------------------
// Written out here rather than shared with fused_decode.cpp's kernels (which look alike): those may change
// their order for speed (one row takes four chains there), while this order is the mode's contract.
//
// w . x over n: one accumulator of 8 lanes over the blocks of 8 (lane j sums elements i = j mod 8, in order,
// with a fused multiply-add), the lanes reduced j + 4, then j + 2, then 0 + 1, then the last n mod 8
// elements added in order (fused). A tile computes R rows x O output features at once, each pair with its
// own accumulator in exactly that order: the tile shape shares loads and never changes a result.

template <int R, int O>
void bi_tile_portable(const float* w, int64_t ldw, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy) {
  float acc[R][O][8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int r = 0; r < R; ++r)
      for (int o = 0; o < O; ++o)
        for (int j = 0; j < 8; ++j) acc[r][o][j] = std::fma(w[o * ldw + i + j], x[r * ldx + i + j], acc[r][o][j]);
  for (int r = 0; r < R; ++r)
    for (int o = 0; o < O; ++o) {
      float* a = acc[r][o];
      float s[4];
      for (int j = 0; j < 4; ++j) s[j] = a[j] + a[j + 4];
      s[0] += s[2];
      s[1] += s[3];
      float sum = s[0] + s[1];
      for (int64_t k = i; k < n; ++k) sum = std::fma(w[o * ldw + k], x[r * ldx + k], sum);
      y[r * ldy + o] = sum;
    }
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) inline float bi_hsum(__m256 v) {
  // Lanes j + 4, then j + 2, then 0 + 1: the portable path's order.
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

template <int R, int O>
__attribute__((target("avx2,fma"))) void bi_tile_avx2(const float* w, int64_t ldw, const float* x, int64_t ldx,
                                                      int64_t n, float* y, int64_t ldy) {
  // Fully unrolled so that the accumulators live in registers, not in a stack array.
  __m256 acc[R][O];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int o = 0; o < O; ++o) acc[r][o] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 wv[O];
#pragma GCC unroll 4
    for (int o = 0; o < O; ++o) wv[o] = _mm256_loadu_ps(w + o * ldw + i);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + r * ldx + i);
#pragma GCC unroll 4
      for (int o = 0; o < O; ++o) acc[r][o] = _mm256_fmadd_ps(wv[o], xv, acc[r][o]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int o = 0; o < O; ++o) {
      float sum = bi_hsum(acc[r][o]);
      for (int64_t k = i; k < n; ++k) sum = __builtin_fmaf(w[o * ldw + k], x[r * ldx + k], sum);
      y[r * ldy + o] = sum;
    }
}
#endif

// The largest tile: 4 x 3 accumulators, 3 weight vectors and a row's vector fill the 16 AVX registers.
constexpr int kTileR = 4, kTileO = 3;
using BiTile = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t);

// Every tile shape up to kTileR x kTileO ([rows - 1][outputs - 1]), of one path chosen once per process.
struct BiTiles {
  BiTile tile[kTileR][kTileO];
};

template <int R, int O>
struct PortableTile {
  static constexpr BiTile fn = bi_tile_portable<R, O>;
};
#if defined(__x86_64__)
template <int R, int O>
struct Avx2Tile {
  static constexpr BiTile fn = bi_tile_avx2<R, O>;
};
#endif

template <template <int, int> class K>
BiTiles bi_tiles_of() {
  return BiTiles{{{K<1, 1>::fn, K<1, 2>::fn, K<1, 3>::fn},
                  {K<2, 1>::fn, K<2, 2>::fn, K<2, 3>::fn},
                  {K<3, 1>::fn, K<3, 2>::fn, K<3, 3>::fn},
                  {K<4, 1>::fn, K<4, 2>::fn, K<4, 3>::fn}}};
}

const BiTiles& bi_tiles() {
  static const BiTiles chosen = [] {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return bi_tiles_of<Avx2Tile>();
#endif
    return bi_tiles_of<PortableTile>();
  }();
  return chosen;
}

// a . b in the fixed order (a 1 x 1 tile).
float bi_dot(const float* a, const float* b, int64_t n) {
  float out;
  bi_tiles().tile[0][0](a, 0, b, 0, n, &out, 0);
  return out;
}

// Rows and output features per parallel tile of a matrix product: a tile's weight rows stay in L1 while its
// rows stream past them.
constexpr int64_t kTileRows = 32, kTileOut = 48;

// y[r, o] = w[o] . x[r] (+ bias[o]) for x [rows, in], w [out, in], y [rows, out], all contiguous.
void bi_linear_raw(const float* x, int64_t rows, int64_t in, const float* w, int64_t out, const float* bias,
                   float* y) {
  const BiTiles& tiles = bi_tiles();
  const int64_t row_tiles = (rows + kTileRows - 1) / kTileRows, out_tiles = (out + kTileOut - 1) / kTileOut;
  at::parallel_for(0, row_tiles * out_tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t r0 = (tile / out_tiles) * kTileRows, o0 = (tile % out_tiles) * kTileOut;
      const int64_t r1 = std::min(rows, r0 + kTileRows), o1 = std::min(out, o0 + kTileOut);
      for (int64_t o = o0; o < o1; o += kTileO) {
        const int64_t oo = std::min<int64_t>(kTileO, o1 - o);
        for (int64_t r = r0; r < r1; r += kTileR) {
          const int64_t rr = std::min<int64_t>(kTileR, r1 - r);
          tiles.tile[rr - 1][oo - 1](w + o * in, in, x + r * in, in, in, y + r * out + o, out);
        }
      }
      if (bias != nullptr)
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t o = o0; o < o1; ++o) y[r * out + o] += bias[o];
    }
  });
}

const float* bi_data(const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

// out = weight * (x * (1 / sqrt(mean(x^2) + eps))) for one row of n.
void bi_rms_norm_row(const float* x, int64_t n, const float* weight, double eps, float* out) {
  const float mean_square = bi_dot(x, x, n) / static_cast<float>(n);
  const float scale = 1.0f / std::sqrt(mean_square + static_cast<float>(eps));
  for (int64_t i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * scale);
}

void bi_rms_norm_rows(const float* x, int64_t rows, int64_t n, const float* weight, double eps, float* out) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) bi_rms_norm_row(x + r * n, n, weight, eps, out + r * n);
  });
}

// x cos + rotate_half(x) sin in place, rotate_half(x) = (-x[half:], x[:half]).
void bi_rotate(float* x, const float* cos, const float* sin, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float lo = x[i], hi = x[i + half];
    const float a = lo * cos[i], b = (-hi) * sin[i];
    const float c = hi * cos[i + half], e = lo * sin[i + half];
    x[i] = a + b;
    x[i + half] = c + e;
  }
}

float bi_silu(float x) { return x / (1.0f + std::exp(-x)); }

// cos and sin [tokens, head_dim] for each token's position, from tables computed a fixed 64 positions at a
// time: a position's values come from the same elementwise call whatever the other tokens are.
std::pair<at::Tensor, at::Tensor> bi_rotary_rows(const std::vector<int64_t>& positions, const ModelConfig& config) {
  constexpr int64_t kChunk = 64;
  const int64_t d = config.head_dim(), n = static_cast<int64_t>(positions.size());
  auto cos = torch::empty({n, d}, torch::kFloat32), sin = torch::empty({n, d}, torch::kFloat32);
  std::map<int64_t, std::pair<at::Tensor, at::Tensor>> chunks;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t p = positions[static_cast<size_t>(t)];
    const int64_t c = p / kChunk;
    auto it = chunks.find(c);
    if (it == chunks.end()) {
      auto ids = torch::arange(c * kChunk, (c + 1) * kChunk, torch::TensorOptions().dtype(torch::kInt64)).view({1, kChunk});
      auto [cc, ss] = rotary_cos_sin(ids, config, torch::kFloat32);
      it = chunks.emplace(c, std::make_pair(cc.reshape({kChunk, d}).contiguous(), ss.reshape({kChunk, d}).contiguous()))
               .first;
    }
    cos[t].copy_(it->second.first[p % kChunk]);
    sin[t].copy_(it->second.second[p % kChunk]);
  }
  return {cos, sin};
}

// A host array of int64 as a [rows, cols] tensor on `device` (a copy).
at::Tensor bi_upload(const int64_t* data, int64_t rows, int64_t cols, const torch::Device& device) {
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  if (rows * cols == 0) return torch::zeros({rows, cols}, i64.device(device));
  return torch::from_blob(const_cast<int64_t*>(data), {rows, cols}, i64).to(device);
}

// The decoder on CUDA: forward_layers' steps, each a batch-invariant CUDA kernel. The rotary tables are the
// CPU's (bi_rotary_rows), uploaded, so both halves rotate by the same values.
void bi_forward_layers_cuda(at::Tensor& h, const ModelConfig& config, const fused_decode::Shape& s,
                            const std::vector<fused_decode::LayerWeights>& layers, std::vector<at::Tensor>& keys,
                            std::vector<at::Tensor>& values, const fused_decode::BlockTables& tables,
                            const batch_invariant::Tokens& tokens) {
  namespace kb = kernels::batch_invariant;
  const auto device = h.device();
  const auto n = static_cast<int64_t>(tokens.row.size());
  if (n == 0) return;
  const int64_t table_rows = *std::max_element(tokens.row.begin(), tokens.row.end()) + 1;
  const auto [cos_host, sin_host] = bi_rotary_rows(tokens.position, config);
  const auto cos = cos_host.to(device), sin = sin_host.to(device);
  kb::Places places{bi_upload(tokens.row.data(), n, 1, device).view({n}),
                    bi_upload(tokens.slot.data(), n, 1, device).view({n}),
                    bi_upload(tables.ids, table_rows, tables.width, device), tables.block_size};
  const at::Tensor key_mask = tokens.key_mask != nullptr
                                  ? bi_upload(tokens.key_mask, table_rows, tokens.key_mask_stride, device)
                                  : at::Tensor();
  const double scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  for (size_t li = 0; li < layers.size(); ++li) {
    const fused_decode::LayerWeights& w = layers[li];
    auto x = kb::rms_norm(h, w.input_norm, s.eps);
    auto q = kb::linear(x, w.q, w.q_bias), k = kb::linear(x, w.k, w.k_bias), v = kb::linear(x, w.v, w.v_bias);
    kb::heads_into_cache({q, k, v, w.q_norm, w.k_norm, cos, sin, keys[li], values[li], s.heads, s.kv_heads, s.eps},
                         places);
    const auto attn = kb::attention(q, keys[li], values[li], places, key_mask, s.heads, s.sliding_window, scale);
    h.add_(kb::linear(attn, w.o, w.o_bias));
    x = kb::rms_norm(h, w.post_norm, s.eps);
    auto gate = kb::linear(x, w.gate);
    kb::swiglu_(gate, kb::linear(x, w.up));
    h.add_(kb::linear(gate, w.down));
  }
}

// The CUDA decoder's operands: everything float32, contiguous, on h's device, in nn::Linear's shapes.
void bi_check_cuda_supported(const at::Tensor& h, const fused_decode::Shape& s,
                             const std::vector<fused_decode::LayerWeights>& layers) {
  const int64_t q_dim = s.heads * s.head_dim, kv_dim = s.kv_heads * s.head_dim;
  auto fits = [&](const at::Tensor& t, std::initializer_list<int64_t> sizes, bool optional) {
    if (!t.defined()) return optional;
    return t.device() == h.device() && t.scalar_type() == at::kFloat && t.is_contiguous() && t.sizes().equals(sizes);
  };
  bool ok = fits(h, {h.size(0), s.hidden}, false);
  for (const fused_decode::LayerWeights& w : layers)
    ok = ok && fits(w.input_norm, {s.hidden}, false) && fits(w.post_norm, {s.hidden}, false) &&
         fits(w.q, {q_dim, s.hidden}, false) && fits(w.k, {kv_dim, s.hidden}, false) &&
         fits(w.v, {kv_dim, s.hidden}, false) && fits(w.o, {s.hidden, q_dim}, false) &&
         fits(w.q_bias, {q_dim}, true) && fits(w.k_bias, {kv_dim}, true) && fits(w.v_bias, {kv_dim}, true) &&
         fits(w.o_bias, {s.hidden}, true) && fits(w.q_norm, {s.head_dim}, true) && fits(w.k_norm, {s.head_dim}, true) &&
         fits(w.gate, {s.ffn, s.hidden}, false) && fits(w.up, {s.ffn, s.hidden}, false) &&
         fits(w.down, {s.hidden, s.ffn}, false);
  HF_CHECK(ok, kKey, ": the batch-invariant CUDA kernels need contiguous float32 weights on ", h.device(),
           " in nn::Linear's [out, in] layout (not a generation-layout gather); the activations are ",
           h.scalar_type());
}

}  // namespace

BatchInvariantGuard::BatchInvariantGuard(bool on) : previous_(batch_invariant_on) { batch_invariant_on = on; }
BatchInvariantGuard::~BatchInvariantGuard() { batch_invariant_on = previous_; }

bool batch_invariant_active() { return batch_invariant_on && !torch::GradMode::is_enabled(); }

namespace batch_invariant {

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias) {
  if (x.is_cuda())
    return kernels::batch_invariant::linear(x.contiguous(), w.contiguous(), bias.defined() ? bias.contiguous() : bias);
  HF_CHECK(x.device().is_cpu() && w.device().is_cpu() && x.scalar_type() == torch::kFloat32 &&
               w.scalar_type() == torch::kFloat32 && w.dim() == 2 && x.dim() == 2 && x.size(1) == w.size(1) &&
               (!bias.defined() || (bias.scalar_type() == torch::kFloat32 && bias.numel() == w.size(0))),
           kKey, ": the batch-invariant kernels take float32 CPU tensors (x [rows, in], w [out, in]); got x ",
           x.sizes(), " ", x.scalar_type(), " on ", x.device(), ", w ", w.sizes(), " ", w.scalar_type());
  auto xc = x.contiguous();
  auto wc = w.contiguous();
  auto bc = bias.defined() ? bias.contiguous() : bias;
  auto y = torch::empty({x.size(0), w.size(0)}, torch::kFloat32);
  bi_linear_raw(xc.data_ptr<float>(), x.size(0), x.size(1), wc.data_ptr<float>(), w.size(0), bi_data(bc),
                y.data_ptr<float>());
  return y;
}

RowLogProbs token_log_probs(const torch::Tensor& logits, const torch::Tensor& targets, double temperature,
                            bool with_entropy) {
  if (logits.is_cuda()) {
    auto [log_probs, entropy] =
        kernels::batch_invariant::token_log_probs(logits.contiguous(), targets, temperature, with_entropy);
    return {log_probs, entropy};
  }
  HF_CHECK(logits.dim() == 2 && logits.device().is_cpu() && logits.scalar_type() == torch::kFloat32 &&
               targets.dim() == 1 && targets.size(0) == logits.size(0),
           kKey, ": log-probs take float32 CPU logits [rows, vocab] and targets [rows]; got ", logits.sizes(), " ",
           logits.scalar_type(), " and ", targets.sizes());
  const auto z = logits.contiguous();
  const auto ids = targets.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t rows = z.size(0), vocab = z.size(1);
  RowLogProbs out;
  out.log_probs = torch::empty({rows}, torch::kFloat32);
  out.entropy = with_entropy ? torch::empty({rows}, torch::kFloat32) : torch::Tensor();
  const float* zp = z.data_ptr<float>();
  const int64_t* tp = ids.data_ptr<int64_t>();
  float* lp = out.log_probs.data_ptr<float>();
  float* ent = with_entropy ? out.entropy.data_ptr<float>() : nullptr;
  const auto t = static_cast<float>(temperature);
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scaled(static_cast<size_t>(vocab));
    for (int64_t r = begin; r < end; ++r) {
      const float* row = zp + r * vocab;
      float top = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < vocab; ++i) {
        scaled[static_cast<size_t>(i)] = row[i] / t;
        top = std::max(top, scaled[static_cast<size_t>(i)]);
      }
      double sum = 0, weighted = 0;
      for (int64_t i = 0; i < vocab; ++i) {
        const float shifted = scaled[static_cast<size_t>(i)] - top;
        const double e = std::exp(static_cast<double>(shifted));
        sum += e;
        if (ent != nullptr) weighted += e * shifted;
      }
      const int64_t target = tp[r];
      HF_CHECK(target >= 0 && target < vocab, kKey, ": target ", target, " outside the vocabulary [0, ", vocab, ")");
      const double log_sum = std::log(sum);
      lp[r] = static_cast<float>(static_cast<double>(scaled[static_cast<size_t>(target)] - top) - log_sum);
      if (ent != nullptr) ent[r] = static_cast<float>(log_sum - weighted / sum);
    }
  });
  return out;
}

void check_supported(const at::Tensor& h, const fused_decode::Shape& shape,
                     const std::vector<fused_decode::LayerWeights>& layers) {
  if (h.is_cuda()) return bi_check_cuda_supported(h, shape, layers);
  HF_CHECK(h.device().is_cpu() && h.scalar_type() == at::kFloat, kKey,
           ": the batch-invariant kernels run on the CPU in float32; the model's activations are ", h.scalar_type(),
           " on ", h.device());
  HF_CHECK(fused_decode::supports(h.contiguous(), shape, layers), kKey,
           ": the batch-invariant kernels need contiguous float32 weights in nn::Linear's [out, in] layout (not "
           "a generation-layout gather)");
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (x.is_cuda())
    return kernels::batch_invariant::rms_norm(x.reshape({-1, x.size(-1)}).contiguous(), weight.contiguous(), eps)
        .view(x.sizes());
  auto xc = x.contiguous();
  auto wc = weight.contiguous();
  const int64_t n = xc.size(-1);
  auto out = torch::empty_like(xc);
  bi_rms_norm_rows(xc.data_ptr<float>(), xc.numel() / n, n, wc.data_ptr<float>(), eps, out.data_ptr<float>());
  return out;
}

void forward_layers(at::Tensor& h, const ModelConfig& config, const fused_decode::Shape& s,
                    const std::vector<fused_decode::LayerWeights>& layers, std::vector<at::Tensor>& keys,
                    std::vector<at::Tensor>& values, const fused_decode::BlockTables& tables, const Tokens& tokens) {
  const int64_t n = h.size(0), hidden = s.hidden, d = s.head_dim, heads = s.heads, kv = s.kv_heads;
  const int64_t q_dim = heads * d, kv_dim = kv * d, group = heads / kv;
  HF_CHECK(h.is_contiguous() && h.dim() == 2 && h.size(1) == hidden &&
               static_cast<int64_t>(tokens.row.size()) == n && tokens.slot.size() == tokens.row.size() &&
               tokens.position.size() == tokens.row.size(),
           kKey, ": internal: ", n, " tokens with ", tokens.row.size(), " rows");
  if (h.is_cuda()) return bi_forward_layers_cuda(h, config, s, layers, keys, values, tables, tokens);
  const auto [cos_t, sin_t] = bi_rotary_rows(tokens.position, config);
  const float* cos = cos_t.data_ptr<float>();
  const float* sin = sin_t.data_ptr<float>();
  auto normed = torch::empty({n, hidden}, torch::kFloat32);
  auto q = torch::empty({n, q_dim}, torch::kFloat32), k = torch::empty({n, kv_dim}, torch::kFloat32);
  auto v = torch::empty({n, kv_dim}, torch::kFloat32), attn = torch::empty({n, q_dim}, torch::kFloat32);
  auto proj = torch::empty({n, hidden}, torch::kFloat32);
  auto gate = torch::empty({n, s.ffn}, torch::kFloat32), up = torch::empty({n, s.ffn}, torch::kFloat32);
  float* hp = h.data_ptr<float>();
  float* xp = normed.data_ptr<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  auto key_ptr = [&](float* pool, int64_t r, int64_t g, int64_t j) {
    const int64_t block = tables.ids[r * tables.width + j / tables.block_size];
    return pool + ((block * kv + g) * tables.block_size + j % tables.block_size) * d;
  };
  for (size_t li = 0; li < layers.size(); ++li) {
    const fused_decode::LayerWeights& w = layers[li];
    float* key_pool = keys[li].data_ptr<float>();
    float* value_pool = values[li].data_ptr<float>();
    bi_rms_norm_rows(hp, n, hidden, w.input_norm.data_ptr<float>(), s.eps, xp);
    bi_linear_raw(xp, n, hidden, w.q.data_ptr<float>(), q_dim, bi_data(w.q_bias), q.data_ptr<float>());
    bi_linear_raw(xp, n, hidden, w.k.data_ptr<float>(), kv_dim, bi_data(w.k_bias), k.data_ptr<float>());
    bi_linear_raw(xp, n, hidden, w.v.data_ptr<float>(), kv_dim, bi_data(w.v_bias), v.data_ptr<float>());
    float* qp = q.data_ptr<float>();
    float* kp = k.data_ptr<float>();
    const float* vp = v.data_ptr<float>();
    // Per token: q/k norms (Qwen3), rotary, and its key and value into the cache.
    at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> tmp(static_cast<size_t>(d));
      // One head of token t in place: its norm (when the model has one) and its rotation.
      auto norm_and_rotate = [&](float* x, const at::Tensor& norm, int64_t t) {
        if (norm.defined()) {
          bi_rms_norm_row(x, d, norm.data_ptr<float>(), s.eps, tmp.data());
          std::copy(tmp.begin(), tmp.end(), x);
        }
        bi_rotate(x, cos + t * d, sin + t * d, d);
      };
      for (int64_t t = begin; t < end; ++t) {
        for (int64_t head = 0; head < heads; ++head) norm_and_rotate(qp + t * q_dim + head * d, w.q_norm, t);
        const int64_t r = tokens.row[static_cast<size_t>(t)], slot = tokens.slot[static_cast<size_t>(t)];
        for (int64_t g = 0; g < kv; ++g) {
          float* x = kp + t * kv_dim + g * d;
          norm_and_rotate(x, w.k_norm, t);
          std::copy_n(x, d, key_ptr(key_pool, r, g, slot));
          std::copy_n(vp + t * kv_dim + g * d, d, key_ptr(value_pool, r, g, slot));
        }
      }
    });
    // Attention per token and query head over its visible keys, in key order.
    float* ap = attn.data_ptr<float>();
    at::parallel_for(0, n * heads, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> scores;
      std::vector<int64_t> seen;
      for (int64_t u = begin; u < end; ++u) {
        const int64_t t = u / heads, head = u % heads, g = head / group;
        const int64_t r = tokens.row[static_cast<size_t>(t)], last = tokens.slot[static_cast<size_t>(t)];
        const int64_t first = s.sliding_window > 0 ? std::max<int64_t>(0, last - s.sliding_window + 1) : 0;
        const float* query = qp + t * q_dim + head * d;
        const int64_t* mask = tokens.key_mask != nullptr ? tokens.key_mask + r * tokens.key_mask_stride : nullptr;
        seen.clear();
        scores.clear();
        float top = -std::numeric_limits<float>::infinity();
        for (int64_t j = first; j <= last; ++j) {
          if (mask != nullptr && mask[j] == 0) continue;
          const float score = bi_dot(query, key_ptr(key_pool, r, g, j), d) * scale;
          seen.push_back(j);
          scores.push_back(score);
          top = std::max(top, score);
        }
        float* out = ap + t * q_dim + head * d;
        std::fill_n(out, d, 0.0f);
        if (seen.empty()) continue;  // a padding query: nothing to see, and nothing reads its output
        float total = 0;
        for (float& score : scores) {
          score = std::exp(score - top);
          total += score;
        }
        for (size_t i = 0; i < seen.size(); ++i) {
          const float p = scores[i] / total;
          const float* value = key_ptr(value_pool, r, g, seen[i]);
          for (int64_t c = 0; c < d; ++c) out[c] += p * value[c];
        }
      }
    });
    bi_linear_raw(ap, n, q_dim, w.o.data_ptr<float>(), hidden, bi_data(w.o_bias), proj.data_ptr<float>());
    h.add_(proj);
    bi_rms_norm_rows(hp, n, hidden, w.post_norm.data_ptr<float>(), s.eps, xp);
    bi_linear_raw(xp, n, hidden, w.gate.data_ptr<float>(), s.ffn, nullptr, gate.data_ptr<float>());
    bi_linear_raw(xp, n, hidden, w.up.data_ptr<float>(), s.ffn, nullptr, up.data_ptr<float>());
    float* gp = gate.data_ptr<float>();
    const float* upp = up.data_ptr<float>();
    at::parallel_for(0, n * s.ffn, 4096, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) gp[i] = bi_silu(gp[i]) * upp[i];
    });
    bi_linear_raw(gp, n, s.ffn, w.down.data_ptr<float>(), hidden, nullptr, proj.data_ptr<float>());
    h.add_(proj);
  }
}

}  // namespace batch_invariant
}  // namespace hybridflow
