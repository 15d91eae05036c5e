// 3D-HybridEngine switch, training layout -> generation layout, on N local processes (Gloo), for every
// (train, gen) pair of the process count or the one given, in all three modes of the paper's Table 2
// (pipeline stages, p > 1: p must divide the layers; generation in p_g > 1 stages is hybridflow mode's).
// One JSON line per switch: the largest figure over ranks of bytes sent, generation weight memory,
// redundant bytes and seconds, plus the paper's bytes and the ratios against the all-gather baseline.
// Then generation throughput with t_g < t against t_g = t on the same processes and weights.
//
//   bench_reshard [--processes=4] [--train=P,T,D] [--gen=PG,TG] [--mode=hybridflow|hybridflow-v|allgather]
//                 [--hidden=768] [--layers=6] [--vocab=32000] [--gen-batch=8] [--gen-tokens=16]
//                 [--model=DIR]  (a Hugging Face directory: each rank loads its training shards from it
//                                 instead of random weights of --hidden/--layers/--vocab)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/Parallel.h>

#include <cstdio>
#include <iostream>
#include <sstream>
#include <tuple>
#include <vector>

#include "bench_common.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/engine/hybrid_engine.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/parallel/process_group.h"

using namespace hybridflow;
using bench::arg;
using bench::arg_int;

namespace {

std::vector<int> ints(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) out.push_back(std::stoi(part));
  return out;
}

struct Pair {
  int p, t, d, t_g;
  int p_g = 1;
};

double max_over(Communicator& world, double value) {
  auto t = torch::tensor({value}, torch::kDouble);
  world.all_reduce(t, ReduceOp::kMax);
  return t.item<double>();
}

// A ratio against the all-gather baseline, or null where it was not run (--mode) or moved nothing.
std::string ratio(double value, double baseline) {
  if (baseline <= 0) return "null";
  char text[32];
  std::snprintf(text, sizeof(text), "%.4f", value / baseline);
  return text;
}

ModelConfig bench_config(int argc, char** argv) {
  ModelConfig c;
  c.hidden_size = arg_int(argc, argv, "hidden", 768);
  c.num_attention_heads = c.hidden_size / 64;
  c.num_key_value_heads = c.num_attention_heads / 3 > 0 ? c.num_attention_heads / 3 : 1;
  c.intermediate_size = c.hidden_size * 8 / 3 / 64 * 64;
  c.num_hidden_layers = arg_int(argc, argv, "layers", 6);
  c.vocab_size = arg_int(argc, argv, "vocab", 32000);
  c.max_position_embeddings = 512;
  return c;
}

void run_rank(int rank, int n, int port, const std::vector<Pair>& pairs, const std::vector<ReshardMode>& modes,
              int argc, char** argv) {
  LaunchEnv env;
  env.launcher = "bench";
  env.rank = rank;
  env.world_size = n;
  env.master_addr = "127.0.0.1";
  env.master_port = port;
  ProcessGroupOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::seconds(600);
  ProcessGroup world = ProcessGroup::create_world(env, options);
  Communicator stats_comm(world);
  const std::string model_dir = arg(argc, argv, "model", "");
  const ModelConfig config = model_dir.empty() ? bench_config(argc, argv) : load_model_config(model_dir + "/config.json");
  const int64_t gen_batch = arg_int(argc, argv, "gen-batch", 8);
  GenerationConfig gen;
  gen.greedy = true;
  gen.max_new_tokens = arg_int(argc, argv, "gen-tokens", 16);
  std::map<std::tuple<int, int, int>, double> throughput;  // (p, t, t_g) -> tokens/s
  for (const Pair& pair : pairs) {
    GenerationLayout layout(DeviceMesh(pair.p, pair.d, pair.t), pair.t_g, pair.p_g);
    Communicator tp(world.split(layout.train().tp_groups()));
    const PipelineStage stage{layout.train().coords(rank).pp, pair.p};
    torch::manual_seed(1 + layout.train().coords(rank).tp);
    CausalLM train = model_dir.empty() ? CausalLM(config, HeadKind::kLanguageModel, TensorParallelGroup(&tp), stage)
                                       : load_pretrained(model_dir, HeadKind::kLanguageModel, torch::kFloat32,
                                                         TensorParallelGroup(&tp), stage)
                                             .model;
    double allgather_bytes = 0, allgather_seconds = 0;
    for (ReshardMode mode : modes) {
      if (pair.p_g > 1 && mode != ReshardMode::kHybridFlow) continue;  // the baselines generate unstaged
      HybridEngine engine(train, layout, world, mode);
      stats_comm.barrier();
      const ReshardStats s = engine.to_generation();
      const double sent = max_over(stats_comm, static_cast<double>(s.bytes_sent));
      const double peak = max_over(stats_comm, static_cast<double>(s.peak_extra_weight_bytes));
      const double redundant = max_over(stats_comm, static_cast<double>(s.redundant_bytes));
      const double seconds = max_over(stats_comm, s.seconds);
      if (mode == ReshardMode::kAllGather) allgather_bytes = sent, allgather_seconds = seconds;
      if (mode == ReshardMode::kHybridFlow && pair.p_g == 1 && !throughput.count({pair.p, pair.t, pair.t_g})) {
        // Each generation replica decodes its share of the prompts (3D_ALL_MICRO_DP).
        const int64_t share = std::max<int64_t>(1, gen_batch / engine.generation_replicas());
        std::vector<std::vector<int64_t>> prompts;
        for (int64_t i = 0; i < share; ++i) {
          const int64_t v = config.vocab_size;
          prompts.push_back({(1 + i) % v, (2 + i) % v, (3 + i) % v, (4 + i) % v});
        }
        stats_comm.barrier();
        const double start = bench::now_seconds();
        generate(engine.generation_model(), prompts, gen);
        const double elapsed = max_over(stats_comm, bench::now_seconds() - start);
        throughput[{pair.p, pair.t, pair.t_g}] =
            static_cast<double>(share * engine.generation_replicas() * gen.max_new_tokens) / elapsed;
      }
      engine.to_training();
      if (rank == 0) {
        const ReshardCost paper = paper_reshard_cost(mode, layout, s.model_bytes);
        std::printf(
            "{\"mode\": \"%s\", \"train\": [%d, %d, %d], \"gen\": [%d, %d], \"model_bytes\": %lld, "
            "\"bytes_sent_per_rank\": %.0f, \"paper_bytes_per_rank\": %lld, \"peak_extra_weight_bytes_per_rank\": %.0f, "
            "\"redundant_bytes_per_rank\": %.0f, \"switch_seconds\": %.4f, \"bytes_vs_allgather\": %s, "
            "\"seconds_vs_allgather\": %s}\n",
            s.mode.c_str(), pair.p, pair.t, pair.d, pair.p_g, pair.t_g, static_cast<long long>(s.model_bytes), sent,
            static_cast<long long>(paper.bytes_received), peak, redundant, seconds,
            ratio(sent, allgather_bytes).c_str(), ratio(seconds, allgather_seconds).c_str());
        std::fflush(stdout);
      }
    }
  }
  if (rank == 0) {
    for (const auto& [key, tokens_per_s] : throughput) {
      const auto [p, t, t_g] = key;
      auto same = throughput.find({p, t, t});
      if (t_g == t || same == throughput.end()) continue;
      std::printf("{\"generation\": \"tp_g < tp\", \"train_pp\": %d, \"train_tp\": %d, \"gen_tp\": %d, "
                  "\"tokens_per_s\": %.1f, \"tokens_per_s_at_gen_tp_equal_train_tp\": %.1f, \"speedup\": %.2f}\n",
                  p, t, t_g, tokens_per_s, same->second, tokens_per_s / same->second);
    }
  }
  std::fflush(stdout);  // the child leaves through _exit, which does not flush
}

}  // namespace

int main(int argc, char** argv) {
  const int n = static_cast<int>(arg_int(argc, argv, "processes", 4));
  std::vector<Pair> pairs;
  const std::string train = arg(argc, argv, "train", "");
  if (!train.empty()) {
    const auto ptd = ints(train);
    const auto gen = ints(arg(argc, argv, "gen", "1,1"));
    if (ptd.size() != 3 || gen.size() != 2 || ptd[0] * ptd[1] * ptd[2] != n || gen[0] < 1 || ptd[0] % gen[0] != 0) {
      std::cerr << "bench_reshard: --train=P,T,D with P*T*D = --processes and --gen=PG,TG with PG dividing P\n";
      return 2;
    }
    pairs.push_back({ptd[0], ptd[1], ptd[2], gen[1], gen[0]});
  } else {
    const int layers = static_cast<int>(arg_int(argc, argv, "layers", 6));
    for (int p = 1; p <= n; p *= 2)
      for (int t = n / p; t >= 1; t /= 2)
        if (n % (p * t) == 0 && (p == 1 || layers % p == 0))
          for (int p_g = 1; p_g <= p; p_g *= 2)
            for (int t_g = t; t_g >= 1; t_g /= 2) pairs.push_back({p, t, n / (p * t), t_g, p_g});
  }
  std::vector<ReshardMode> modes = {ReshardMode::kAllGather, ReshardMode::kHybridFlowV, ReshardMode::kHybridFlow};
  const std::string mode = arg(argc, argv, "mode", "");
  if (!mode.empty()) modes = {parse_reshard_mode(mode)};
  const int port = 29000 + static_cast<int>(::getpid() % 2000);
  std::vector<pid_t> children;
  for (int rank = 0; rank < n; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      at::set_num_threads(1);
      try {
        run_rank(rank, n, port, pairs, modes, argc, argv);
      } catch (const std::exception& e) {
        std::cerr << "rank " << rank << ": " << e.what() << "\n";
        ::_exit(1);
      }
      ::_exit(0);
    }
    children.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  if (failed > 0) {
    for (pid_t pid : children) ::kill(pid, SIGKILL);
    std::cerr << "bench_reshard: " << failed << " rank(s) failed\n";
    return 1;
  }
  return 0;
}
