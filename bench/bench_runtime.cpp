// The controller's cost per call: an empty call's round trip (microseconds) and the throughput of
// dispatching a DataProto split across a worker group (DP_PROTO), for 2, 4 and 8 workers. Baseline,
// measured in the same run: the same payload serialized and deserialized inside one process (what a
// transport with zero overhead beyond one copy could reach). Then a result handed from one pool to
// another (a rollout to its readers): through the controller (HF_DATA_PLANE=0's path) vs the data plane,
// time and bytes. Workers are this binary, re-executed.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_common.h"
#include "hybridflow/runtime/controller.h"
#include "hybridflow/runtime/protocol.h"
#include "hybridflow/runtime/worker.h"
#include "hybridflow/runtime/worker_main.h"

using namespace hybridflow;

namespace {

class BenchWorker : public Worker {
 public:
  void register_methods(MethodTable& table) override {
    table.add("noop", protocols::kOneToAll, [](const DataProto&) { return DataProto(); });
    // Touches every byte of its shard (so nothing is skipped) and returns one number per rank.
    table.add("consume", protocols::kDataParallel, [](const DataProto& in) {
      DataProto out;
      out.set_tensor("sum", in.tensor("x").sum({1}).sum().reshape({1}));
      return out;
    });
    // This rank's share of a rows x cols batch, made here (nothing comes from the controller).
    table.add("produce", protocols::kDataParallel, [this](const DataProto& in) {
      DataProto out;
      const int64_t rows = in.meta().at("rows").get<int64_t>() / world_size(), cols = in.meta().at("cols");
      out.set_tensor("x", torch::full({rows, cols}, static_cast<float>(rank() + 1)));
      return out;
    });
  }
};

}  // namespace

HF_REGISTER_WORKER(BenchWorker, "bench_runtime_worker");

int main(int argc, char** argv) {
  run_worker_if_requested();
  at::set_num_threads(1);
  const int calls = static_cast<int>(bench::arg_int(argc, argv, "calls", 300));
  const int64_t mb = bench::arg_int(argc, argv, "mb", 64);
  const int reps = static_cast<int>(bench::arg_int(argc, argv, "reps", 5));

  // 8 workers x rows must divide the batch; float32 rows of 1024 values = 4 KiB each.
  const int64_t cols = 1024;
  const int64_t rows = std::max<int64_t>(8, (mb << 20) / (cols * 4) / 8 * 8);
  DataProto batch;
  batch.set_tensor("x", torch::rand({rows, cols}));
  const double payload_mb = static_cast<double>(rows * cols * 4) / (1 << 20);

  double base_best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t = bench::now_seconds();
    DataProto back = DataProto::deserialize(batch.serialize());
    base_best = std::min(base_best, bench::now_seconds() - t);
    if (back.batch_size() != rows) return 1;
  }
  const double base_mbps = payload_mb / base_best;
  std::printf("payload %.1f MB; in-process serialize+deserialize baseline: %.0f MB/s\n", payload_mb, base_mbps);
  std::printf("%8s %18s %18s %16s %14s\n", "workers", "empty call (us)", "p90 empty (us)", "dispatch MB/s",
              "vs baseline");

  for (int workers : {2, 4, 8}) {
    Controller ctl;
    ResourcePool spec;
    spec.name = "bench";
    spec.num_processes = workers;
    spec.env["OMP_NUM_THREADS"] = "1";
    ctl.add_pool(spec);
    WorkerGroup group = ctl.create_group("bench", "bench", "bench_runtime_worker");

    for (int i = 0; i < 20; ++i) group.call("noop").get();  // warm the sockets
    std::vector<double> us;
    for (int i = 0; i < calls; ++i) {
      const double t = bench::now_seconds();
      group.call("noop").get();
      us.push_back((bench::now_seconds() - t) * 1e6);
    }
    std::sort(us.begin(), us.end());
    const double median = us[us.size() / 2], p90 = us[us.size() * 9 / 10];

    const double expected = batch.tensor("x").sum().item<double>();
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      const double t = bench::now_seconds();
      const double got = group.call("consume", batch).get().tensor("sum").sum().item<double>();
      best = std::min(best, bench::now_seconds() - t);
      if (std::abs(got - expected) > 1e-3 * std::abs(expected)) {
        std::fprintf(stderr, "workers returned %f, expected %f\n", got, expected);
        return 1;
      }
    }
    const double mbps = payload_mb / best;
    std::printf("%8d %18.1f %18.1f %16.0f %13.2fx\n", workers, median, p90, mbps, mbps / base_mbps);
    ctl.shutdown();
  }

  // Pool "producer" (2 processes) makes the batch, pool "consumer" (2 processes) reads it.
  std::printf("\nhand-over of a %.1f MB result between two pools of 2 processes (best of %d):\n", payload_mb, reps);
  std::printf("%22s %10s %10s %16s %16s\n", "path", "seconds", "MB/s", "controller MB", "worker->worker MB");
  double through_controller_s = 0;
  for (const bool data_plane : {false, true}) {
    Controller ctl;
    std::vector<ResourcePool> specs;
    for (const char* name : {"producer", "consumer"}) {
      ResourcePool spec;
      spec.name = name;
      spec.num_processes = 2;
      spec.env["OMP_NUM_THREADS"] = "1";
      spec.data_plane = data_plane;
      specs.push_back(spec);
    }
    ctl.add_pools(specs);
    WorkerGroup producer = ctl.create_group("producer", "producer", "bench_runtime_worker");
    WorkerGroup consumer = ctl.create_group("consumer", "consumer", "bench_runtime_worker");
    DataProto request;
    request.meta()["rows"] = rows;
    request.meta()["cols"] = cols;
    const double expected = static_cast<double>(rows / 2) * cols * (1 + 2);
    double best = 1e30;
    Traffic traffic;
    for (int r = 0; r < reps + 1; ++r) {  // the first round warms the sockets
      ctl.take_traffic();
      const double t = bench::now_seconds();
      const double got = consumer.call("consume", producer.call("produce", request)).get().tensor("sum").sum().item<double>();
      const double seconds = bench::now_seconds() - t;
      traffic = ctl.take_traffic();
      if (r > 0) best = std::min(best, seconds);
      if (std::abs(got - expected) > 1e-3 * expected) {
        std::fprintf(stderr, "consumers returned %f, expected %f\n", got, expected);
        return 1;
      }
    }
    if (!data_plane) through_controller_s = best;
    std::printf("%22s %10.3f %10.0f %16.1f %16.1f%s\n", data_plane ? "data plane" : "through the controller", best,
                payload_mb / best, static_cast<double>(traffic.controller_bytes()) / (1 << 20),
                static_cast<double>(traffic.worker_to_worker_bytes) / (1 << 20),
                data_plane ? (" (" + std::to_string(through_controller_s / best).substr(0, 4) + "x faster)").c_str() : "");
    ctl.shutdown();
  }
  return 0;
}
