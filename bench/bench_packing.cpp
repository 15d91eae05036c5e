// Padding-free packing against the padded batch: forward + backward of the response log-probs of rows with
// mixed prompt and response lengths, on a small decoder. Prints real tokens per second of each path and the
// ratio (the same rows, the same model, measured in one run).
//
//   bench_packing [--rows=16] [--hidden=256] [--layers=4] [--reps=3]
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>

#include "bench_common.h"
#include "hybridflow/engine/model_log_probs.h"
#include "hybridflow/engine/packed_rows.h"

using namespace hybridflow;

int main(int argc, char** argv) {
  const int64_t rows = bench::arg_int(argc, argv, "rows", 16);
  const int64_t hidden = bench::arg_int(argc, argv, "hidden", 256);
  const int64_t layers = bench::arg_int(argc, argv, "layers", 4);
  const int reps = static_cast<int>(bench::arg_int(argc, argv, "reps", 3));
  ModelConfig c;
  c.vocab_size = 1024;
  c.hidden_size = hidden;
  c.intermediate_size = hidden * 3;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  torch::manual_seed(0);
  CausalLM model(c);
  // Prompts of 32..128 tokens, responses of 16..512 (as RL rollouts: most short, some long).
  const int64_t prompt = 128, response = 512;
  auto ids = torch::randint(0, c.vocab_size, {rows, prompt + response}, torch::kLong);
  auto mask = torch::zeros({rows, prompt + response}, torch::kLong);
  auto gen = at::detail::createCPUGenerator(1);
  int64_t real = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t p = 32 + torch::randint(0, 97, {1}, gen).item<int64_t>();
    const double u = torch::rand({1}, gen).item<double>();
    const int64_t s = 16 + static_cast<int64_t>(u * u * u * (response - 16));
    mask[r].narrow(0, prompt - p, p + s).fill_(1);
    real += p + s;
  }
  const auto response_mask = mask.narrow(1, prompt, response).to(torch::kFloat);
  auto run = [&](bool packed) {
    model->zero_grad();
    auto lp = packed ? packed_response_log_probs(model, ids, mask, response, 1.0, true)
                     : response_log_probs(model, ids, mask, response, 1.0, true);
    ((lp.log_probs - 0.01 * lp.entropy) * response_mask).sum().backward();
  };
  double best[2] = {1e30, 1e30};
  for (int rep = 0; rep < reps + 1; ++rep) {
    for (int packed = 0; packed < 2; ++packed) {
      const double start = bench::now_seconds();
      run(packed == 1);
      if (rep > 0) best[packed] = std::min(best[packed], bench::now_seconds() - start);  // rep 0 warms up
    }
  }
  std::printf("model: hidden %lld, %lld layers, 8 heads / 4 KV heads, vocab %lld; %lld rows, %lld real of %lld padded tokens\n",
              static_cast<long long>(hidden), static_cast<long long>(layers), static_cast<long long>(c.vocab_size),
              static_cast<long long>(rows), static_cast<long long>(real), static_cast<long long>(rows * (prompt + response)));
  std::printf("padded: %.3f s, %.0f real tokens/s (forward + backward)\n", best[0], real / best[0]);
  std::printf("packed: %.3f s, %.0f real tokens/s (forward + backward)\n", best[1], real / best[1]);
  std::printf("packed / padded throughput: %.2fx\n", best[0] / best[1]);
  return 0;
}
