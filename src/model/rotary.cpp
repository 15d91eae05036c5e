// Each scaling type follows transformers' modeling_rope_utils step by step (same dtypes, same order of
// operations), because a frequency off in its last bit rotates late positions visibly differently.
#include "hybridflow/model/rotary.h"

#include <algorithm>
#include <cmath>

#include "hybridflow/core/error.h"

namespace hybridflow {
namespace {

const auto kF32 = torch::TensorOptions().dtype(torch::kFloat32);

// (0, 2, 4, ..., dim - 2) / dim in float32.
torch::Tensor channel_exponents(int64_t dim) {
  return torch::arange(0, dim, 2, torch::TensorOptions().dtype(torch::kInt64)).to(torch::kFloat32) /
         static_cast<double>(dim);
}

torch::Tensor default_inv_freq(double base, int64_t dim) {
  return 1.0 / torch::pow(base, channel_exponents(dim));
}

int64_t original_context(const ModelConfig& c) {
  return c.rope_scaling.original_max_position_embeddings > 0 ? c.rope_scaling.original_max_position_embeddings
                                                             : c.max_position_embeddings;
}

torch::Tensor llama3_inv_freq(const ModelConfig& c, int64_t dim) {
  const RopeScaling& r = c.rope_scaling;
  auto inv_freq = default_inv_freq(c.rope_theta, dim);
  const double old_context = static_cast<double>(original_context(c));
  const double low_freq_wavelen = old_context / r.low_freq_factor;
  const double high_freq_wavelen = old_context / r.high_freq_factor;
  auto wavelen = 2 * M_PI / inv_freq;
  // Long wavelengths are divided by the factor, short ones kept, and the band between interpolated.
  auto scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / r.factor, inv_freq);
  auto smooth = (old_context / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  auto smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled;
  auto medium = wavelen.lt(high_freq_wavelen).logical_not() & wavelen.gt(low_freq_wavelen).logical_not();
  return torch::where(medium, smoothed, scaled);
}

RotaryFrequencies yarn(const ModelConfig& c, int64_t dim) {
  const RopeScaling& r = c.rope_scaling;
  const double base = c.rope_theta;
  const double factor = r.factor;
  auto mscale_of = [](double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; };
  double attention = 0;
  if (r.attention_factor) {
    attention = *r.attention_factor;
  } else if (r.mscale != 0 && r.mscale_all_dim != 0) {
    attention = mscale_of(factor, r.mscale) / mscale_of(factor, r.mscale_all_dim);
  } else {
    attention = mscale_of(factor, 1.0);
  }
  const double context = static_cast<double>(original_context(c));
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(context / (rotations * 2 * M_PI))) / (2 * std::log(base));
  };
  double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // as transformers: no division by zero in the ramp
  auto pos_freqs = torch::pow(base, channel_exponents(dim));
  auto extrapolation = 1.0 / pos_freqs;
  auto interpolation = 1.0 / (factor * pos_freqs);
  auto ramp = ((torch::arange(dim / 2, kF32) - low) / (high - low)).clamp(0, 1);
  auto extrapolation_weight = 1 - ramp;
  return {interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight, attention};
}

// Dynamic NTK: the base grows with the sequence past max_position_embeddings. transformers computes it from
// a tensor sequence length, so in float32.
torch::Tensor dynamic_inv_freq(const ModelConfig& c, int64_t dim, int64_t max_position) {
  const int64_t seq_len = max_position + 1;
  if (seq_len <= c.max_position_embeddings) return default_inv_freq(c.rope_theta, dim);
  const double factor = c.rope_scaling.factor;
  auto length = torch::tensor(seq_len, torch::TensorOptions().dtype(torch::kInt64));
  auto base = c.rope_theta * torch::pow(factor * length / static_cast<double>(c.max_position_embeddings) - (factor - 1),
                                        static_cast<double>(dim) / static_cast<double>(dim - 2));
  return 1.0 / torch::pow(base, channel_exponents(dim));
}

}  // namespace

RotaryFrequencies rotary_frequencies(const ModelConfig& c, int64_t max_position) {
  const int64_t dim = c.head_dim();
  const std::string& type = c.rope_scaling.type;
  if (type == "default") return {default_inv_freq(c.rope_theta, dim), 1.0};
  if (type == "linear") return {default_inv_freq(c.rope_theta, dim) / c.rope_scaling.factor, 1.0};
  if (type == "llama3") return {llama3_inv_freq(c, dim), 1.0};
  if (type == "yarn") return yarn(c, dim);
  if (type == "dynamic") return {dynamic_inv_freq(c, dim, max_position), 1.0};
  HF_FAIL("rotary embeddings: rope_scaling type '", type, "' is not implemented");
}

std::pair<torch::Tensor, torch::Tensor> rotary_cos_sin(const torch::Tensor& position_ids, const ModelConfig& config,
                                                       torch::ScalarType dtype) {
  // Only dynamic scaling reads the largest position: a device sync the other types do not pay.
  const int64_t max_position =
      config.rope_scaling.type == "dynamic" && position_ids.numel() > 0 ? position_ids.max().item<int64_t>() : 0;
  return rotary_cos_sin(position_ids, rotary_frequencies(config, max_position), dtype);
}

std::pair<torch::Tensor, torch::Tensor> rotary_cos_sin(const torch::Tensor& position_ids, const RotaryFrequencies& f,
                                                       torch::ScalarType dtype) {
  auto inv_freq = f.inv_freq.to(position_ids.device());
  auto freqs = position_ids.to(torch::kFloat32).unsqueeze(-1) * inv_freq;  // [B, T, d/2]
  auto emb = torch::cat({freqs, freqs}, -1).unsqueeze(1);                    // [B, 1, T, d]
  auto cos = emb.cos(), sin = emb.sin();
  if (f.attention_scaling != 1.0) {
    cos = cos * f.attention_scaling;
    sin = sin * f.attention_scaling;
  }
  return {cos.to(dtype), sin.to(dtype)};
}

}  // namespace hybridflow
