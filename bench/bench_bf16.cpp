// fp32 against bf16 in one run, on the same model and data: a training step (bf16 forward/backward
// against fp32 master weights, as the engine trains a bf16 role) and KV-cache generation.
// On a CPU with AMX or AVX512-BF16, libtorch sends bf16 matmuls through oneDNN; without them bf16 is
// emulated and slower than fp32 (hybridflow info says which this machine has).
//   bench_bf16 [--preset=small] [--batch=16] [--seq=128] [--steps=3] [--gen-batch=8] [--new-tokens=64] [--threads=0]
#include <torch/torch.h>

#include <cstdio>
#include <random>

#include "bench_common.h"
#include "hybridflow/core/platform.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/perf/speed_bench.h"
#include "hybridflow/model/model_config.h"
#include "hybridflow/model/transformer.h"

using namespace hybridflow;

namespace {

CausalLM model_in(const ModelConfig& config, torch::Dtype dtype) {
  torch::manual_seed(0);  // the same weights for both dtypes
  CausalLM model(config);
  model->to(dtype);
  return model;
}

double train_step_seconds(const ModelConfig& config, torch::Dtype dtype, int64_t batch, int64_t seq, int64_t steps) {
  CausalLM model = model_in(config, dtype);
  return measure_train_step(model, batch, seq, steps);  // fp32 logits in both cases
}

double generation_tokens_per_s(const ModelConfig& config, torch::Dtype dtype, int64_t batch, int64_t new_tokens) {
  CausalLM model = model_in(config, dtype);
  std::mt19937_64 rng(0);
  std::vector<std::vector<int64_t>> prompts(batch);
  for (auto& p : prompts) {
    p.resize(16 + rng() % 17);
    for (auto& t : p) t = 3 + static_cast<int64_t>(rng() % (config.vocab_size - 3));
  }
  GenerationConfig gen;
  gen.max_new_tokens = new_tokens;
  gen.seed = 1;
  gen.eos_token_ids.clear();  // every row generates every token: the same work for both dtypes
  generate(model, prompts, gen);  // warm-up
  const double start = bench::now_seconds();
  GenerationOutput out = generate(model, prompts, gen);
  return out.response_mask.sum().item<double>() / (bench::now_seconds() - start);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string preset = bench::arg(argc, argv, "preset", "small");
  const int64_t batch = bench::arg_int(argc, argv, "batch", 16);
  const int64_t seq = bench::arg_int(argc, argv, "seq", 128);
  const int64_t steps = bench::arg_int(argc, argv, "steps", 3);
  const int64_t gen_batch = bench::arg_int(argc, argv, "gen-batch", 8);
  const int64_t new_tokens = bench::arg_int(argc, argv, "new-tokens", 64);
  init_threads(static_cast<int>(bench::arg_int(argc, argv, "threads", 0)));
  const ModelConfig config = preset_model_config(preset, 256);
  const RuntimeInfo info = runtime_info();

  const double train32 = train_step_seconds(config, torch::kFloat32, batch, seq, steps);
  const double train16 = train_step_seconds(config, torch::kBFloat16, batch, seq, steps);
  const double gen32 = generation_tokens_per_s(config, torch::kFloat32, gen_batch, new_tokens);
  const double gen16 = generation_tokens_per_s(config, torch::kBFloat16, gen_batch, new_tokens);

  std::printf("bf16 vs fp32: preset %s (%lld params), %d threads, bf16 matmul: %s\n", preset.c_str(),
              static_cast<long long>(config.num_parameters()), at::get_num_threads(), info.bf16.matmul_path().c_str());
  std::printf("  %-44s %10s %10s %8s\n", "", "fp32", "bf16", "bf16/fp32");
  std::printf("  %-44s %8.1f ms %8.1f ms %7.2fx\n",
              ("train step, " + std::to_string(batch) + "x" + std::to_string(seq) + " tokens (time)").c_str(),
              train32 * 1e3, train16 * 1e3, train32 / train16);
  std::printf("  %-44s %10.0f %10.0f %7.2fx\n",
              ("generation tokens/s, batch " + std::to_string(gen_batch)).c_str(), gen32, gen16, gen16 / gen32);
  return 0;
}
