// Data-parallel actor update: the same PPO update (one optimizer step on the whole batch) on 1 process
// and on 2 data-parallel processes, 1 thread each, the "small" preset (3.67M parameters with the default
// vocabulary). Reports the update's wall time and, for 2 processes, the gradient all-reduce volume and
// time the Communicator accounted; and the same 2 processes with the ZeRO-1 optimizer
// (use_distributed_optimizer): its time, bytes moved and optimizer state per rank against plain data
// parallelism's. Baseline: the 1-process update in the same run.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "bench_common.h"
#include "hybridflow/runtime/controller.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/workers/rl_workers.h"

using namespace hybridflow;

int main(int argc, char** argv) {
  register_rl_workers();
  run_worker_if_requested();
  const int64_t rows = bench::arg_int(argc, argv, "rows", 16);
  const int64_t prompt = bench::arg_int(argc, argv, "prompt", 32);
  const int64_t response = bench::arg_int(argc, argv, "response", 32);
  const int64_t vocab = bench::arg_int(argc, argv, "vocab", 1024);
  const int repeats = static_cast<int>(bench::arg_int(argc, argv, "repeats", 3));
  at::set_num_threads(1);

  auto pool = [](const std::string& name, int n) {
    ResourcePool p;
    p.name = name;
    p.num_processes = n;
    p.env["OMP_NUM_THREADS"] = "1";
    p.env["OMP_WAIT_POLICY"] = "passive";
    return p;
  };
  Controller ctl;
  ctl.add_pools({pool("one", 1), pool("dp", 2), pool("zero", 2)});
  auto config = [&](int64_t mini_rows) {
    return nlohmann::json{
        {"model", {{"preset", "small"}, {"vocab_size", vocab}, {"init_seed", 1}, {"eos_token_id", 2}, {"pad_token_id", 0}}},
        {"actor", {{"lr", 1e-4}, {"mini_batch_rows", mini_rows}, {"micro_batch_rows", 8}, {"epochs", 1}, {"shuffle", false}}},
        {"rollout", {{"response_length", response}}}};
  };
  WorkerGroup one = ctl.create_group("one", "actor", kActorRolloutRefWorkerType, {}, config(rows));
  WorkerGroup dp = ctl.create_group("dp", "actor", kActorRolloutRefWorkerType, {}, config(rows / 2));
  nlohmann::json zero_config = config(rows / 2);
  zero_config["actor"]["use_distributed_optimizer"] = true;
  WorkerGroup zero = ctl.create_group("zero", "actor", kActorRolloutRefWorkerType, {}, zero_config);

  torch::manual_seed(0);
  DataProto batch;
  auto ids = torch::randint(3, vocab, {rows, prompt + response}, torch::kLong);
  batch.set_tensor("input_ids", ids);
  batch.set_tensor("attention_mask", torch::ones_like(ids));
  batch.set_tensor("responses", ids.slice(1, prompt).contiguous());
  batch.set_tensor("response_mask", torch::ones({rows, response}, torch::kLong));
  batch.update(one.call("compute_log_prob", batch).get());
  batch.set_tensor("advantages", torch::randn({rows, response}));

  auto time_update = [&](WorkerGroup& g, nlohmann::json* metrics) {
    std::vector<double> times;
    for (int i = 0; i < repeats; ++i) {
      const double start = bench::now_seconds();
      DataProto out = g.call("update_actor", batch).get();
      times.push_back(bench::now_seconds() - start);
      *metrics = out.meta().at("metrics");
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  };
  nlohmann::json m1, m2, m3;
  const double t1 = time_update(one, &m1);
  const double t2 = time_update(dp, &m2);
  const double t3 = time_update(zero, &m3);
  const int64_t params = one.call("flat_parameters").get().tensor("parameters").numel();
  std::printf("actor update, %lld rows x %lld tokens (%lld response), %lld parameters, median of %d\n",
              static_cast<long long>(rows), static_cast<long long>(prompt + response),
              static_cast<long long>(response), static_cast<long long>(params), repeats);
  std::printf("  1 process : %8.1f ms\n", t1 * 1e3);
  std::printf("  2 processes: %8.1f ms (speed-up %.2fx); gradient all-reduce %.2f MB, %.1f ms per update\n",
              t2 * 1e3, t1 / t2, m2.at("actor/dp_allreduce_bytes").get<double>() / 1e6,
              m2.at("actor/dp_allreduce_s").get<double>() * 1e3);
  const double state_plain = m2.at("actor/optimizer_state_bytes").get<double>();
  const double state_zero = m3.at("actor/optimizer_state_bytes").get<double>();
  std::printf("  2 processes, ZeRO-1: %8.1f ms (%.2fx plain); reduce-scatter + all-gather %.2f MB, %.1f ms per update;\n"
              "    optimizer state per rank %.2f MB vs %.2f MB plain (%.2fx)\n",
              t3 * 1e3, t2 / t3, m3.at("actor/dp_allreduce_bytes").get<double>() / 1e6,
              m3.at("actor/dp_allreduce_s").get<double>() * 1e3, state_zero / 1e6, state_plain / 1e6,
              state_zero / state_plain);
  std::printf("  grad_norm 1 process %.6f, 2 processes %.6f, ZeRO-1 %.6f\n", m1.at("actor/grad_norm").get<double>(),
              m2.at("actor/grad_norm").get<double>(), m3.at("actor/grad_norm").get<double>());
  return 0;
}
