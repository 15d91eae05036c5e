// The fused decode kernels' checks, their dispatch (CUDA kernels on CUDA tensors, decode_kernels.cu) and their
// CPU references, which compute the same arithmetic (kernels/element_math.h) in plain loops.
#include "hybridflow/kernels/decode_kernels.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "hybridflow/core/env_switch.h"
#include "hybridflow/core/error.h"
#include "kernels/element_math.h"
#include "kernels/kernel_dtypes.h"

#ifdef HF_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "kernels/cuda_launch.h"
#endif

namespace hybridflow::kernels {
namespace {

Mode mode_from_environment() {
  return env_switch("HF_DECODE_KERNELS", true, "the fused CUDA decode kernels") ? Mode::kCuda : Mode::kOff;
}

std::atomic<Mode>& mode_slot() {
  static std::atomic<Mode> slot{mode_from_environment()};
  return slot;
}

PagedAttentionVariant paged_attention_variant_from_environment() {
  const char* v = std::getenv("HF_PAGED_ATTENTION");
  if (v == nullptr) return PagedAttentionVariant::kV1;
  const std::string s(v);
  if (s == "v1" || s.empty()) return PagedAttentionVariant::kV1;
  if (s == "v2") return PagedAttentionVariant::kV2;
  HF_FAIL("HF_PAGED_ATTENTION: expected v1 or v2 (the paged decode attention's CUDA kernels), got '", s, "'");
}

std::atomic<PagedAttentionVariant>& paged_attention_variant_slot() {
  static std::atomic<PagedAttentionVariant> slot{paged_attention_variant_from_environment()};
  return slot;
}

void check_operands(const char* what, const torch::Tensor& first, std::initializer_list<torch::Tensor> rest) {
  HF_CHECK(first.defined() && detail::kernel_dtype(first.scalar_type()), "kernels::", what,
           ": expected a float32, float16 or bfloat16 tensor, got ",
           first.defined() ? c10::toString(first.scalar_type()) : "an undefined tensor");
  for (const auto& t : rest)
    HF_CHECK(t.defined() && t.scalar_type() == first.scalar_type() && t.device() == first.device(), "kernels::",
             what, ": every operand must be a ", first.scalar_type(), " tensor on ", first.device(), ", got ",
             t.defined() ? c10::toString(t.scalar_type()) : "an undefined tensor", " on ",
             t.defined() ? t.device().str() : "no device");
}


#ifdef HF_WITH_CUDA
void* current_stream(const torch::Tensor& t) { return at::cuda::getCurrentCUDAStream(t.device().index()).stream(); }
void check_launch(const char* what, const char* error) {
  HF_CHECK(error == nullptr, "kernels::", what, ": CUDA launch failed: ", error);
}
#endif

void check_cuda_build(const char* what, const torch::Tensor& t) {
#ifndef HF_WITH_CUDA
  HF_CHECK(!t.is_cuda(), "kernels::", what, ": a CUDA tensor in a build without CUDA kernels (HF_CUDA=1)");
#endif
  HF_CHECK(t.is_cpu() || t.is_cuda(), "kernels::", what, ": tensors on ", t.device(), " (expected CPU or CUDA)");
}

// rms_norm and add_rms_norm: rows of x's last dimension; with delta, sum = x + delta first.
NormedSum norm_rows(const char* what, const torch::Tensor& x, const torch::Tensor* delta, const torch::Tensor& weight,
                    double eps) {
  RECORD_FUNCTION(delta != nullptr ? "hybridflow::add_rms_norm" : "hybridflow::rms_norm", std::vector<c10::IValue>());
  if (delta != nullptr)
    check_operands(what, x, {*delta, weight});
  else
    check_operands(what, x, {weight});
  check_cuda_build(what, x);
  const int64_t n = x.dim() > 0 ? x.size(-1) : 0;
  HF_CHECK(x.dim() > 0 && weight.dim() == 1 && weight.size(0) == n && (delta == nullptr || delta->sizes() == x.sizes()),
           "kernels::", what, ": expected x [..., n], weight [n]", delta ? " and delta shaped as x" : "", ", got ",
           x.sizes(), ", ", weight.sizes(), delta ? ", " : "", delta ? delta->sizes() : x.sizes());
  const int64_t rows = n > 0 ? x.numel() / n : 0;
  const auto x_c = x.contiguous();
  const auto delta_c = delta != nullptr ? delta->contiguous() : torch::Tensor();
  NormedSum out;
  if (x.is_cuda()) {
#ifdef HF_WITH_CUDA
    const c10::cuda::CUDAGuard guard(x.device());
    out.normed = torch::empty_like(x_c);
    if (delta != nullptr) out.sum = torch::empty_like(x_c);
    const auto w = weight.contiguous();
    check_launch(what, cuda::rms_norm(detail::cuda_dtype_of(x.scalar_type()), x_c.data_ptr(),
                                      delta ? delta_c.data_ptr() : nullptr, w.data_ptr(),
                                      delta ? out.sum.data_ptr() : nullptr, out.normed.data_ptr(), rows, n,
                                      static_cast<float>(eps), current_stream(x)));
#endif
    return out;
  }
  auto xf = detail::float_copy(x_c), wf = detail::float_copy(weight);
  auto df = delta != nullptr ? detail::float_copy(delta_c) : torch::Tensor();
  auto sum = delta != nullptr ? torch::empty_like(xf) : torch::Tensor();
  auto normed = torch::empty_like(xf);
  const float* xp = xf.data_ptr<float>();
  const float* wp = wf.data_ptr<float>();
  float* np = normed.data_ptr<float>();
  detail::with_reference_rounding(x.scalar_type(), [&](auto round) {
    for (int64_t r = 0; r < rows; ++r) {
      const float* in = xp + r * n;
      if (delta != nullptr) {
        float* s = sum.data_ptr<float>() + r * n;
        const float* d = df.data_ptr<float>() + r * n;
        for (int64_t i = 0; i < n; ++i) s[i] = round(in[i] + d[i]);
        in = s;
      }
      float squares = 0.0f;
      for (int64_t i = 0; i < n; ++i) squares += in[i] * in[i];
      const float inverse = math::rms_inverse(squares, static_cast<int>(n), static_cast<float>(eps));
      for (int64_t i = 0; i < n; ++i) np[r * n + i] = math::rms_norm_element(in[i], inverse, wp[i], round);
    }
  });
  out.normed = normed.to(x.scalar_type()).view(x.sizes());
  if (delta != nullptr) out.sum = sum.to(x.scalar_type()).view(x.sizes());
  return out;
}

}  // namespace

Mode mode() { return mode_slot().load(); }
void set_mode(Mode m) { mode_slot().store(m); }

PagedAttentionVariant paged_attention_variant() { return paged_attention_variant_slot().load(); }
void set_paged_attention_variant(PagedAttentionVariant variant) { paged_attention_variant_slot().store(variant); }

bool active_for(const torch::Device& device) {
  switch (mode()) {
    case Mode::kOff: return false;
    case Mode::kEverywhere: return true;
    case Mode::kCuda:
#ifdef HF_WITH_CUDA
      return device.is_cuda();
#else
      return false;
#endif
  }
  return false;
}

bool supports(torch::ScalarType dtype, int64_t heads, int64_t kv_heads, int64_t head_dim) {
  return detail::kernel_dtype(dtype) && kv_heads > 0 && heads % kv_heads == 0 && head_dim % 2 == 0 && head_dim >= 2 &&
         head_dim <= 256 && decode_partition_size(1, heads, kv_heads, head_dim, 1) > 0;
}

int64_t decode_partition_size(int64_t rows, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t span) {
  if (kv_heads <= 0 || heads % kv_heads != 0) return 0;
  const int64_t group = heads / kv_heads;
  const auto fits = [&](int64_t size) {
    return group * (head_dim + size) * int64_t{4} + size * int64_t{8} <= int64_t{48} * 1024;
  };
  const auto blocks = [&](int64_t size) { return rows * kv_heads * ((span + size - 1) / size); };
  int64_t size = 256;
  while (size > 32 && (!fits(size) || (blocks(size) < 256 && span > size))) size /= 2;
  return fits(size) ? size : 0;
}

int64_t split_partition_size(int64_t rows, int64_t kv_heads, int64_t span, int64_t block_size,
                             int64_t multiprocessors) {
  const int64_t granule = block_size % 2 == 0 ? block_size : 2 * block_size;
  const auto round_up = [&](int64_t n) { return (n + granule - 1) / granule * granule; };
  const int64_t blocks = rows * kv_heads, wanted = 2 * multiprocessors;
  if (blocks >= wanted) return round_up(span);
  const int64_t parts = (wanted + blocks - 1) / blocks;
  return std::max(round_up(64), round_up((span + parts - 1) / parts));
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  return norm_rows("rms_norm", x, nullptr, weight, eps).normed;
}

NormedSum add_rms_norm(const torch::Tensor& residual, const torch::Tensor& delta, const torch::Tensor& weight,
                       double eps) {
  return norm_rows("add_rms_norm", residual, &delta, weight, eps);
}

torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up) {
  RECORD_FUNCTION("hybridflow::swiglu", std::vector<c10::IValue>());
  check_operands("swiglu", gate, {up});
  check_cuda_build("swiglu", gate);
  HF_CHECK(gate.sizes() == up.sizes(), "kernels::swiglu: gate and up must have one shape, got ", gate.sizes(), " and ",
           up.sizes());
  const auto g = gate.contiguous(), u = up.contiguous();
  if (gate.is_cuda()) {
    auto out = torch::empty_like(g);
#ifdef HF_WITH_CUDA
    const c10::cuda::CUDAGuard guard(gate.device());
    check_launch("swiglu", cuda::swiglu(detail::cuda_dtype_of(gate.scalar_type()), g.data_ptr(), u.data_ptr(), out.data_ptr(),
                                        g.numel(), current_stream(gate)));
#endif
    return out;
  }
  auto gf = detail::float_copy(g), uf = detail::float_copy(u);
  auto out = torch::empty_like(gf);
  const float* gp = gf.data_ptr<float>();
  const float* up_p = uf.data_ptr<float>();
  float* op = out.data_ptr<float>();
  detail::with_reference_rounding(gate.scalar_type(), [&](auto round) {
    for (int64_t i = 0; i < gf.numel(); ++i) op[i] = math::swiglu_element(gp[i], up_p[i], round);
  });
  return out.to(gate.scalar_type());
}

torch::Tensor rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  RECORD_FUNCTION("hybridflow::rotary", std::vector<c10::IValue>());
  check_operands("rotary", x, {cos, sin});
  check_cuda_build("rotary", x);
  HF_CHECK(x.dim() == 3 && x.size(2) % 2 == 0 && cos.dim() == 2 && cos.size(0) == x.size(0) &&
               cos.size(1) == x.size(2) && sin.sizes() == cos.sizes(),
           "kernels::rotary: expected x [rows, heads, head_dim] (head_dim even) and cos, sin [rows, head_dim], got ",
           x.sizes(), ", ", cos.sizes(), ", ", sin.sizes());
  const int64_t rows = x.size(0), heads = x.size(1), dim = x.size(2), half = dim / 2;
  const auto xc = x.contiguous(), cc = cos.contiguous(), sc = sin.contiguous();
  if (x.is_cuda()) {
    auto out = torch::empty_like(xc);
#ifdef HF_WITH_CUDA
    const c10::cuda::CUDAGuard guard(x.device());
    check_launch("rotary", cuda::rotary(detail::cuda_dtype_of(x.scalar_type()), xc.data_ptr(), cc.data_ptr(), sc.data_ptr(),
                                        out.data_ptr(), rows, heads, dim, current_stream(x)));
#endif
    return out;
  }
  auto xf = detail::float_copy(xc), cf = detail::float_copy(cc), sf = detail::float_copy(sc);
  auto out = torch::empty_like(xf);
  const float* xp = xf.data_ptr<float>();
  const float* cp = cf.data_ptr<float>();
  const float* sp = sf.data_ptr<float>();
  float* op = out.data_ptr<float>();
  detail::with_reference_rounding(x.scalar_type(), [&](auto round) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t d = 0; d < dim; ++d) {
          const int64_t i = (r * heads + h) * dim + d;
          const bool first_half = d < half;
          op[i] = math::rotary_element(xp[i], xp[first_half ? i + half : i - half], first_half, cp[r * dim + d],
                                       sp[r * dim + d], round);
        }
  });
  return out.to(x.scalar_type());
}

torch::Tensor paged_decode_attention(const torch::Tensor& q, const torch::Tensor& key_pool,
                                     const torch::Tensor& value_pool, const torch::Tensor& tables,
                                     const torch::Tensor& lengths, int64_t span, double scale,
                                     int64_t sliding_window, int64_t partition_size) {
  const char* what = "paged_decode_attention";
  RECORD_FUNCTION("hybridflow::paged_decode_attention", std::vector<c10::IValue>());
  check_operands(what, q, {key_pool, value_pool});
  check_cuda_build(what, q);
  HF_CHECK(q.dim() == 3 && key_pool.dim() == 4 && value_pool.sizes() == key_pool.sizes() &&
               key_pool.size(3) == q.size(2) && key_pool.size(1) > 0 && q.size(1) % key_pool.size(1) == 0,
           "kernels::", what, ": expected q [rows, heads, head_dim] and key/value pools [blocks, kv_heads, block_size, ",
           "head_dim] with heads a multiple of kv_heads, got ", q.sizes(), ", ", key_pool.sizes(), ", ",
           value_pool.sizes());
  HF_CHECK(key_pool.is_contiguous() && value_pool.is_contiguous(), "kernels::", what,
           ": the key and value pools must be contiguous (they are read in place)");
  const int64_t rows = q.size(0), heads = q.size(1), dim = q.size(2), kv = key_pool.size(1);
  const int64_t block_size = key_pool.size(2);
  HF_CHECK(tables.dim() == 2 && tables.size(0) == rows && tables.size(1) > 0 && lengths.dim() == 1 &&
               lengths.size(0) == rows && tables.scalar_type() == torch::kInt64 &&
               lengths.scalar_type() == torch::kInt64 && tables.device() == q.device() &&
               lengths.device() == q.device(),
           "kernels::", what, ": expected tables [", rows, ", width] and lengths [", rows, "], int64 on ", q.device(),
           ", got ", tables.sizes(), " ", tables.scalar_type(), " on ", tables.device(), " and ", lengths.sizes(), " ",
           lengths.scalar_type(), " on ", lengths.device());
  HF_CHECK(span >= 1 && span <= tables.size(1) * block_size, "kernels::", what, ": span ", span,
           " must be in [1, width x block_size = ", tables.size(1) * block_size, "]");
  HF_CHECK(supports(q.scalar_type(), heads, kv, dim), "kernels::", what, ": unsupported shape: ", heads,
           " query heads over ", kv, " KV heads of ", dim, " dims (head_dim must be even and at most 256)");
  HF_CHECK(rows < 65536 && kv < 65536, "kernels::", what, ": at most 65535 rows and KV heads, got ", rows, " and ", kv);
  // kV2 on CUDA tensors whose rows start on whole pairs of elements (a tensor's own storage always does).
  [[maybe_unused]] bool split = false;
  const auto qc = q.contiguous();
  int64_t size = partition_size;
#ifdef HF_WITH_CUDA
  if (q.is_cuda() && paged_attention_variant() == PagedAttentionVariant::kV2) {
    const auto pairs = static_cast<uintptr_t>(2 * q.element_size());
    const auto on_pairs = [&](const torch::Tensor& t) {
      return reinterpret_cast<uintptr_t>(t.data_ptr()) % pairs == 0;
    };
    split = on_pairs(qc) && on_pairs(key_pool) && on_pairs(value_pool);
    if (split && size == 0)
      size = split_partition_size(rows, kv, span, block_size,
                                  at::cuda::getDeviceProperties(q.device().index())->multiProcessorCount);
  }
#endif
  if (size == 0) size = decode_partition_size(rows, heads, kv, dim, span);
  HF_CHECK(size > 0 && size % 2 == 0 && decode_partition_size(1, heads, kv, dim, 1) > 0, "kernels::", what,
           ": partition size ", size, " (expected a positive even number)");
  const int64_t partitions = (span + size - 1) / size;
  const int64_t group = heads / kv;
  const auto tc = tables.contiguous(), lc = lengths.contiguous();

  if (q.is_cuda()) {
    auto out = torch::empty_like(qc);
#ifdef HF_WITH_CUDA
    if (split)  // the reduce keeps one weight per partition in shared memory
      HF_CHECK(partitions <= 12288, "kernels::", what, ": partition size ", size, " splits span ", span, " into ",
               partitions, " partitions (at most 12288)");
    else
      HF_CHECK(group * (dim + size) * 4 + size * 8 <= 48 * 1024, "kernels::", what, ": partition size ", size,
               " needs more than 48 KiB of shared memory for ", group, " query heads per KV head");
    const c10::cuda::CUDAGuard guard(q.device());
    // kV2 with one partition writes the output directly: no partial results.
    const int64_t kept = split && partitions == 1 ? 0 : partitions;
    const auto f32 = q.options().dtype(torch::kFloat32);
    auto partial_out = torch::empty({rows, heads, kept, dim}, f32);
    auto partial_max = torch::empty({rows, heads, kept}, f32);
    auto partial_sum = torch::empty({rows, heads, kept}, f32);
    cuda::PagedAttention args{qc.data_ptr(), key_pool.data_ptr(), value_pool.data_ptr(), tc.data_ptr<int64_t>(),
                              lc.data_ptr<int64_t>(), out.data_ptr(), partial_out.data_ptr<float>(),
                              partial_max.data_ptr<float>(), partial_sum.data_ptr<float>(), rows, heads, kv, dim,
                              tables.size(1), block_size, span, sliding_window, size, partitions,
                              static_cast<float>(scale)};
    const auto dtype = detail::cuda_dtype_of(q.scalar_type());
    check_launch(what, split ? cuda::paged_decode_attention_v2(dtype, args, current_stream(q))
                             : cuda::paged_decode_attention(dtype, args, current_stream(q)));
#endif
    return out;
  }

  // The CPU reference: the kernels' partitions and their reduction, in loops.
  const int64_t width = tables.size(1), blocks = key_pool.size(0);
  auto qf = detail::float_copy(qc), kf = detail::float_copy(key_pool), vf = detail::float_copy(value_pool);
  auto out = torch::empty({rows, heads, dim}, torch::kFloat32);
  const float* qp = qf.data_ptr<float>();
  const float* kp = kf.data_ptr<float>();
  const float* vp = vf.data_ptr<float>();
  const int64_t* tp = tc.data_ptr<int64_t>();
  const int64_t* lp = lc.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  std::vector<float> scores(static_cast<size_t>(size)), part_out(static_cast<size_t>(partitions * dim));
  std::vector<float> part_max(static_cast<size_t>(partitions)), part_sum(static_cast<size_t>(partitions));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t length = lp[r] + 1;
    HF_CHECK(lp[r] >= 0, "kernels::", what, ": row ", r, " has a negative length ", lp[r]);
    const int64_t end = std::min(length, span);
    const int64_t begin = sliding_window > 0 ? std::max<int64_t>(0, length - sliding_window) : 0;
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t kv_head = h / group;
      const float* query = qp + (r * heads + h) * dim;
      for (int64_t p = 0; p < partitions; ++p) {
        const int64_t lo = std::max(begin, p * size), hi = std::min(end, (p + 1) * size);
        float* o = part_out.data() + p * dim;
        std::fill(o, o + dim, 0.0f);
        part_max[static_cast<size_t>(p)] = -std::numeric_limits<float>::max();
        part_sum[static_cast<size_t>(p)] = 0.0f;
        if (lo >= hi) continue;
        std::vector<int64_t> offsets;
        float m = -std::numeric_limits<float>::max();
        for (int64_t j = lo; j < hi; ++j) {
          const int64_t block = tp[r * width + j / block_size];
          HF_CHECK(block >= 0 && block < blocks, "kernels::", what, ": row ", r, " names block ", block, " of ",
                   blocks);
          offsets.push_back(((block * kv + kv_head) * block_size + j % block_size) * dim);
          float dot = 0.0f;
          for (int64_t d = 0; d < dim; ++d) dot += query[d] * kp[offsets.back() + d];
          scores[static_cast<size_t>(j - lo)] = dot * static_cast<float>(scale);
          m = std::max(m, scores[static_cast<size_t>(j - lo)]);
        }
        float s = 0.0f;
        for (int64_t j = 0; j < hi - lo; ++j) {
          const float e = std::exp(scores[static_cast<size_t>(j)] - m);
          s += e;
          for (int64_t d = 0; d < dim; ++d) o[d] += e * vp[offsets[static_cast<size_t>(j)] + d];
        }
        part_max[static_cast<size_t>(p)] = m;
        part_sum[static_cast<size_t>(p)] = s;
      }
      float m = -std::numeric_limits<float>::max(), total = 0.0f;
      for (int64_t p = 0; p < partitions; ++p)
        if (part_sum[static_cast<size_t>(p)] > 0.0f) m = std::max(m, part_max[static_cast<size_t>(p)]);
      for (int64_t p = 0; p < partitions; ++p)
        if (part_sum[static_cast<size_t>(p)] > 0.0f)
          total += part_sum[static_cast<size_t>(p)] * std::exp(part_max[static_cast<size_t>(p)] - m);
      float* result = op + (r * heads + h) * dim;
      for (int64_t d = 0; d < dim; ++d) {
        float acc = 0.0f;
        for (int64_t p = 0; p < partitions; ++p)
          if (part_sum[static_cast<size_t>(p)] > 0.0f)
            acc += std::exp(part_max[static_cast<size_t>(p)] - m) * part_out[static_cast<size_t>(p * dim + d)];
        result[d] = acc / total;
      }
    }
  }
  return out.to(q.scalar_type());
}

}  // namespace hybridflow::kernels
