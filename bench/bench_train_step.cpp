// Training-step throughput: tokens/s and achieved GFLOP/s of forward + backward + AdamW on a
// Llama-style model, next to the GFLOP/s of a plain large fp32 matmul measured in the same run.
// The ratio says how much of the machine's matmul speed a real training step gets.
//   bench_train_step [--preset=small] [--batch=16] [--seq=128] [--steps=5] [--threads=0]
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>

#include "bench_common.h"
#include "hybridflow/core/data_proto.h"
#include "hybridflow/core/platform.h"
#include "hybridflow/engine/train_engine.h"
#include "hybridflow/model/model_config.h"
#include "hybridflow/model/transformer.h"

using namespace hybridflow;

namespace {

double matmul_gflops(int64_t n, int reps) {
  auto a = torch::randn({n, n});
  auto b = torch::randn({n, n});
  torch::mm(a, b);  // warm-up
  double start = bench::now_seconds();
  for (int i = 0; i < reps; ++i) torch::mm(a, b);
  double seconds = bench::now_seconds() - start;
  return 2.0 * n * n * n * reps / seconds / 1e9;
}

// Forward + backward FLOPs per token: 6 x (matmul parameters) plus attention scores and mixing
// (2 matmuls of T x d per layer forward, x3 with backward).
double train_flops_per_token(const ModelConfig& c, int64_t seq) {
  double params = static_cast<double>(c.num_parameters()) - static_cast<double>(c.vocab_size * c.hidden_size);  // embedding lookup is no matmul
  if (c.tie_word_embeddings) params += static_cast<double>(c.vocab_size * c.hidden_size);
  double attention = 2.0 * 2.0 * static_cast<double>(seq) * c.hidden_size * c.num_hidden_layers;
  return 6.0 * params + 3.0 * attention;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string preset = bench::arg(argc, argv, "preset", "small");
  const int64_t batch = bench::arg_int(argc, argv, "batch", 16);
  const int64_t seq = bench::arg_int(argc, argv, "seq", 128);
  const int64_t steps = bench::arg_int(argc, argv, "steps", 5);
  init_threads(static_cast<int>(bench::arg_int(argc, argv, "threads", 0)));
  BlasInfo blas = warn_if_slow_blas();

  ModelConfig config = preset_model_config(preset, 256);
  torch::manual_seed(0);
  CausalLM model(config);
  model->train();
  OptimizerOptions opt;
  opt.schedule.lr = 1e-4;
  TrainEngine engine(model.ptr(), opt);

  DataProto data;
  data.set_tensor("input_ids", torch::randint(3, config.vocab_size, {batch, seq}, torch::kLong));
  data.set_tensor("loss_mask", torch::ones({batch, seq - 1}));
  auto loss_fn = [&](const DataProto& mb) {
    const auto& ids = mb.tensor("input_ids");
    auto mask = torch::ones_like(ids);
    auto logits = model->forward(ids, mask).logits;
    auto lp = torch::log_softmax(logits.slice(1, 0, seq - 1), -1);
    auto target = ids.slice(1, 1).unsqueeze(-1);
    return -lp.gather(-1, target).squeeze(-1).mean();
  };

  engine.train_step(data, batch, loss_fn);  // warm-up: allocations, optimizer state
  double start = bench::now_seconds();
  for (int64_t i = 0; i < steps; ++i) engine.train_step(data, batch, loss_fn);
  double seconds = (bench::now_seconds() - start) / static_cast<double>(steps);

  double tokens = static_cast<double>(batch * seq);
  double step_gflops = train_flops_per_token(config, seq) * tokens / seconds / 1e9;
  double mm_gflops = matmul_gflops(1024, 10);

  std::printf("train step: preset %s (%lld params), batch %lld x %lld tokens, %d threads, BLAS %s (OPENBLAS_CORETYPE=%s)\n", preset.c_str(),
              static_cast<long long>(config.num_parameters()), static_cast<long long>(batch),
              static_cast<long long>(seq), at::get_num_threads(), blas.library.c_str(),
              std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : "auto");
  std::printf("  step time:             %8.1f ms\n", seconds * 1e3);
  std::printf("  throughput:            %8.0f tokens/s\n", tokens / seconds);
  std::printf("  achieved:              %8.1f GFLOP/s (fwd + bwd, 6N + attention per token)\n", step_gflops);
  std::printf("  plain 1024^3 matmul:   %8.1f GFLOP/s\n", mm_gflops);
  std::printf("  ratio step/matmul:     %8.2f\n", step_gflops / mm_gflops);
  return 0;
}
