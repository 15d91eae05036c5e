// Generation throughput: a batch of prompts decoded with the KV cache and with full recomputation of
// the sequence at every step, and the ratio of the two. Same model, prompts and seed for both.
//   bench_generation [--preset=tiny] [--batch=32] [--new-tokens=128] [--threads=0] [--n=1] [--full=1]
// --batch counts prompts; with --n each is sampled n times (batch x n rows). --full=0 skips the (slow)
// full-recompute baseline.
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <random>

#include "bench_common.h"
#include "hybridflow/core/platform.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/model/model_config.h"
#include "hybridflow/model/transformer.h"

using namespace hybridflow;

int main(int argc, char** argv) {
  const std::string preset = bench::arg(argc, argv, "preset", "tiny");
  const int64_t batch = bench::arg_int(argc, argv, "batch", 32);
  const int64_t new_tokens = bench::arg_int(argc, argv, "new-tokens", 128);
  const int64_t n = bench::arg_int(argc, argv, "n", 1);
  const bool full = bench::arg_int(argc, argv, "full", 1) != 0;
  init_threads(static_cast<int>(bench::arg_int(argc, argv, "threads", 0)));
  BlasInfo blas = warn_if_slow_blas();

  ModelConfig config = preset_model_config(preset, 64);
  torch::manual_seed(0);
  CausalLM model(config);
  model->eval();

  std::mt19937_64 rng(0);
  std::vector<std::vector<int64_t>> prompts(batch);
  for (auto& p : prompts) {
    p.resize(16 + rng() % 17);  // 16..32 tokens: a ragged, left-padded batch
    for (auto& t : p) t = 3 + static_cast<int64_t>(rng() % 61);
  }

  auto run = [&](bool cache) {
    GenerationConfig gen;
    gen.max_new_tokens = new_tokens;
    gen.seed = 1;
    gen.n = n;
    gen.eos_token_ids.clear();  // every row generates all new tokens, so both modes do the same work
    gen.use_kv_cache = cache;
    double start = bench::now_seconds();
    GenerationOutput out = generate(model, prompts, gen);
    double seconds = bench::now_seconds() - start;
    double tokens = out.response_mask.sum().item<double>();
    return std::make_pair(tokens / seconds, seconds);
  };
  run(true);  // warm-up
  auto [cached_tps, cached_s] = run(true);
  auto [full_tps, full_s] = full ? run(false) : std::make_pair(0.0, 0.0);

  std::printf("generation: preset %s (%lld params), batch %lld x n %lld, prompts 16-32 tokens, %lld new tokens, %d threads, BLAS %s (OPENBLAS_CORETYPE=%s)\n",
              preset.c_str(), static_cast<long long>(config.num_parameters()), static_cast<long long>(batch), static_cast<long long>(n),
              static_cast<long long>(new_tokens), at::get_num_threads(), blas.library.c_str(),
              std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : "auto");
  std::printf("  KV cache:          %10.0f tokens/s (%.2f s)\n", cached_tps, cached_s);
  if (full) {
    std::printf("  full recompute:    %10.0f tokens/s (%.2f s)\n", full_tps, full_s);
    std::printf("  ratio cache/full:  %10.2fx\n", cached_tps / full_tps);
  }
  return 0;
}
