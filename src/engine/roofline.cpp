// Roofline bounds: counting a model's matmul work and measuring the machine's bandwidth and matmul speed.
#include "hybridflow/engine/roofline.h"

#include <algorithm>
#include <chrono>

#include "hybridflow/core/error.h"
#include "hybridflow/core/steady_seconds.h"

namespace hybridflow {

std::vector<MatmulShape> model_matmul_shapes(const ModelConfig& c) {
  const int64_t q_dim = c.num_attention_heads * c.head_dim();
  const int64_t kv_dim = c.num_key_value_heads * c.head_dim();
  const int64_t layers = c.num_hidden_layers;
  return {
      {"q_proj", q_dim, c.hidden_size, layers},
      {"k_proj", kv_dim, c.hidden_size, layers},
      {"v_proj", kv_dim, c.hidden_size, layers},
      {"o_proj", c.hidden_size, q_dim, layers},
      {"gate_proj", c.intermediate_size, c.hidden_size, layers},
      {"up_proj", c.intermediate_size, c.hidden_size, layers},
      {"down_proj", c.hidden_size, c.intermediate_size, layers},
      {"lm_head", c.vocab_size, c.hidden_size, 1},
  };
}

int64_t matmul_parameters(const ModelConfig& config) {
  int64_t total = 0;
  for (const MatmulShape& s : model_matmul_shapes(config)) total += s.out_features * s.in_features * s.count;
  return total;
}

double decode_weight_bytes(const ModelConfig& config, torch::Dtype dtype) {
  return static_cast<double>(matmul_parameters(config)) * static_cast<double>(c10::elementSize(dtype));
}

double forward_flops_per_token(const ModelConfig& c, double context) {
  const double q_dim = static_cast<double>(c.num_attention_heads * c.head_dim());
  const double attention = 2.0 * 2.0 * context * q_dim * static_cast<double>(c.num_hidden_layers);
  return 2.0 * static_cast<double>(matmul_parameters(c)) + attention;
}

double train_flops_per_token(const ModelConfig& config, int64_t seq) {
  return 3.0 * forward_flops_per_token(config, static_cast<double>(seq));
}

double best_seconds(const std::function<void()>& fn, int min_reps, double min_seconds) {
  fn();  // warm-up: allocations, first-touch pages, oneDNN primitive caches
  double best = 1e300, total = 0;
  for (int rep = 0; rep < min_reps || total < min_seconds; ++rep) {
    const double start = steady_seconds();
    fn();
    const double took = steady_seconds() - start;
    best = std::min(best, took);
    total += took;
  }
  return best;
}

double stream_triad_gb_per_s(int64_t elements, int min_reps) {
  HF_CHECK(elements > 0, "stream triad: elements must be positive, got ", elements);
  torch::NoGradGuard no_grad;
  // fill_ touches every page first, so the timed passes measure memory, not page faults.
  torch::Tensor a = torch::empty({elements}).fill_(0.0);
  torch::Tensor b = torch::empty({elements}).fill_(1.0);
  torch::Tensor c = torch::empty({elements}).fill_(2.0);
  const double seconds = best_seconds([&] { at::add_out(a, b, c, 3.0); }, min_reps, 0.2);
  return 3.0 * 4.0 * static_cast<double>(elements) / seconds / 1e9;
}

MatmulTiming time_matmuls(const std::vector<MatmulShape>& shapes, int64_t rows, torch::Dtype dtype,
                          double min_seconds) {
  HF_CHECK(rows > 0, "matmul timing: rows must be positive, got ", rows);
  torch::NoGradGuard no_grad;
  const auto options = torch::TensorOptions().dtype(dtype);
  // Distinct weights, as the model holds them: one shared weight would sit in cache and flatter small batches.
  struct Item {
    torch::Tensor x, w;
  };
  std::vector<Item> items;
  MatmulTiming timing;
  for (const MatmulShape& s : shapes) {
    torch::Tensor x = torch::randn({rows, s.in_features}, options);
    for (int64_t i = 0; i < s.count; ++i) items.push_back({x, torch::randn({s.out_features, s.in_features}, options) * 0.02});
    timing.flops += 2.0 * static_cast<double>(rows * s.out_features * s.in_features * s.count);
  }
  timing.seconds = best_seconds(
      [&] {
        for (const Item& item : items) torch::linear(item.x, item.w);
      },
      3, min_seconds);
  return timing;
}

}  // namespace hybridflow
