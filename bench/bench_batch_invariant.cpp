// The cost of rollout.batch_invariant: the same model, prompts and seed generated and scored with the ordinary
// kernels and with the batch-invariant ones, alternately in one run, and the ratio of their times.
//   bench_batch_invariant [--threads=0] [--prompts=8] [--n=4] [--new-tokens=32] [--rows=8] [--repeats=3]
// Default shape: 31.5M parameters (hidden 512, 8 layers, 8 heads and 8 key/value heads, MLP 1536, vocabulary
// 4096, untied), float32. Rollout: prompts x n sequences of 16-32 prompt tokens and new-tokens new ones each
// (continuous batching, paged KV cache). Log-probs: `rows` sequences of 32 prompt and 96 response tokens in
// one micro-batch (the actor's old-log-prob pass). Also decode at batch 1. `repeats` pairs each.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "bench_common.h"
#include "hybridflow/core/platform.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/engine/model_log_probs.h"
#include "hybridflow/model/batch_invariant.h"
#include "hybridflow/model/model_config.h"
#include "hybridflow/model/transformer.h"

using namespace hybridflow;

int main(int argc, char** argv) {
  const int64_t prompts_count = bench::arg_int(argc, argv, "prompts", 8);
  const int64_t n = bench::arg_int(argc, argv, "n", 4);
  const int64_t new_tokens = bench::arg_int(argc, argv, "new-tokens", 32);
  const int64_t rows = bench::arg_int(argc, argv, "rows", 8);
  const int64_t repeats = bench::arg_int(argc, argv, "repeats", 3);
  init_threads(static_cast<int>(bench::arg_int(argc, argv, "threads", 0)));
  BlasInfo blas = warn_if_slow_blas();

  ModelConfig c;
  c.vocab_size = 4096;
  c.hidden_size = 512;
  c.num_hidden_layers = 8;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 8;
  c.intermediate_size = 1536;
  c.validate();
  torch::manual_seed(0);
  CausalLM model(c);
  model->eval();

  std::mt19937_64 rng(0);
  std::vector<std::vector<int64_t>> prompts(static_cast<size_t>(prompts_count));
  for (auto& p : prompts) {
    p.resize(16 + rng() % 17);
    for (auto& t : p) t = 3 + static_cast<int64_t>(rng() % 4000);
  }
  GenerationConfig gen;
  gen.max_new_tokens = new_tokens;
  gen.seed = 1;
  gen.n = n;
  gen.eos_token_ids.clear();  // every sequence generates all new tokens: both modes do the same work
  GenerationConfig single = gen;
  single.n = 1;
  single.max_new_tokens = 64;

  auto ids = torch::randint(3, 4000, {rows, 128}, torch::kInt64);
  auto mask = torch::ones({rows, 128}, torch::kInt64);
  auto log_probs = [&] {
    torch::NoGradGuard no_grad;
    response_log_probs(model, ids, mask, 96, 1.0, /*with_entropy=*/false);
  };

  // Each repeat times both modes back to back. On an idle machine the ratio of the fastest times and the
  // median of the pairs' ratios agree; on a loaded one the fastest times are the ones nearest to idle.
  struct Pair {
    double ordinary = 1e30, invariant = 1e30;
    std::vector<double> ratios;
    void add(double o, double i) {
      ordinary = std::min(ordinary, o);
      invariant = std::min(invariant, i);
      ratios.push_back(i / o);
    }
    double median_ratio() {
      std::sort(ratios.begin(), ratios.end());
      return ratios[ratios.size() / 2];
    }
    double ratio() const { return invariant / ordinary; }
  };
  auto time_of = [](bool invariant, const std::function<void()>& run) {
    BatchInvariantGuard mode(invariant);
    const double start = bench::now_seconds();
    run();
    return bench::now_seconds() - start;
  };
  auto compare = [&](const std::function<void()>& run) {
    Pair p;
    time_of(false, run);  // warm-up
    for (int64_t i = 0; i < repeats; ++i) {
      const double o = time_of(false, run);
      p.add(o, time_of(true, run));
    }
    return p;
  };
  Pair rollout = compare([&] { generate(model, prompts, gen); });
  Pair decode = compare([&] { generate(model, {prompts[0]}, single); });
  Pair scoring = compare(log_probs);

  std::printf("batch_invariant: 31.5M params (hidden 512, 8 layers, MLP 1536, vocab 4096), fp32, %d threads, BLAS %s\n",
              at::get_num_threads(), blas.library.c_str());
  const double rollout_tokens = static_cast<double>(prompts_count * n * new_tokens);
  std::printf("  rollout %lld prompts x %lld, %lld new tokens: ordinary %.2f s (%.0f tok/s), batch-invariant %.2f s "
              "(%.0f tok/s), %.2fx the time (fastest of %lld each; median pair %.2fx)\n",
              static_cast<long long>(prompts_count), static_cast<long long>(n), static_cast<long long>(new_tokens),
              rollout.ordinary, rollout_tokens / rollout.ordinary, rollout.invariant, rollout_tokens / rollout.invariant,
              rollout.ratio(), static_cast<long long>(repeats), rollout.median_ratio());
  std::printf("  decode at batch 1, 64 tokens: ordinary %.0f tok/s, batch-invariant %.0f tok/s, %.2fx the time "
              "(median pair %.2fx)\n",
              64 / decode.ordinary, 64 / decode.invariant, decode.ratio(), decode.median_ratio());
  std::printf("  log-probs %lld x (32 + 96) tokens: ordinary %.3f s, batch-invariant %.3f s, %.2fx the time "
              "(median pair %.2fx)\n",
              static_cast<long long>(rows), scoring.ordinary, scoring.invariant, scoring.ratio(), scoring.median_ratio());
  return 0;
}
