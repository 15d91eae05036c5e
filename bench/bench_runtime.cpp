// The controller's cost per call: an empty call's round trip (microseconds) and the throughput of
// dispatching a DataProto split across a worker group (DP_PROTO), for 2, 4 and 8 workers. Baseline,
// measured in the same run: the same payload serialized and deserialized inside one process (what a
// transport with zero overhead beyond one copy could reach). Then a result handed from one pool to
// another (a rollout to its readers): through the controller (HF_DATA_PLANE=0's path) vs the data plane,
// time and bytes. Workers are this binary, re-executed.
// --fanout N: only the fan-out curve instead: an empty call's round trip with 1, 2, 4 ... N workers (light
// ones: no model), and the memory they take (their resident anonymous memory, summed), so that a curve
// stops before the machine runs out of memory.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
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

// A line of /proc/PATH ("VmRSS:   1234 kB" style), in kB; 0 when absent.
int64_t proc_kb(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0) return std::atoll(line.c_str() + key.size() + 1);
  return 0;
}

double process_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The controller's cost of reaching every worker: an empty call's median round trip per group size.
int fanout_curve(int max_workers, int calls) {
  std::printf("%8s %16s %16s %14s %18s %16s\n", "workers", "empty call (us)", "p90 (us)", "us per worker",
              "controller CPU us", "worker RSS (MB)");
  for (int workers = 1; workers <= max_workers; workers *= 2) {
    const int64_t available_kb = proc_kb("/proc/meminfo", "MemAvailable");
    Controller ctl;
    ResourcePool spec;
    spec.name = "fanout";
    spec.num_processes = workers;
    spec.start_timeout_s = 900;  // hundreds of processes loading libtorch on a few cores
    spec.env["OMP_NUM_THREADS"] = "1";
    ctl.add_pool(spec);
    WorkerGroup group = ctl.create_group("fanout", "fanout", "bench_runtime_worker");
    for (int i = 0; i < 10; ++i) group.call("noop").get();
    std::vector<double> us;
    const double cpu_start = process_cpu_seconds();
    for (int i = 0; i < calls; ++i) {
      const double t = bench::now_seconds();
      group.call("noop").get();
      us.push_back((bench::now_seconds() - t) * 1e6);
    }
    // The controller's own work per call (all its threads): what a tree of forwarders would divide.
    const double controller_cpu_us = (process_cpu_seconds() - cpu_start) / calls * 1e6;
    std::sort(us.begin(), us.end());
    int64_t rss_kb = 0;
    for (int pid : ctl.pool("fanout")->pids()) rss_kb += proc_kb("/proc/" + std::to_string(pid) + "/status", "RssAnon");
    const double median = us[us.size() / 2];
    std::printf("%8d %16.0f %16.0f %14.1f %18.0f %16.0f\n", workers, median, us[us.size() * 9 / 10], median / workers,
                controller_cpu_us, static_cast<double>(rss_kb) / 1024);
    std::fflush(stdout);
    ctl.shutdown();
    // The next size doubles the workers: stop while it would leave less than 4 GiB of this machine.
    if (2 * rss_kb + (int64_t(4) << 20) > available_kb && workers * 2 <= max_workers) {
      std::printf("stopping: %d workers would need about %.0f MB, %.0f MB available\n", workers * 2,
                  2.0 * static_cast<double>(rss_kb) / 1024, static_cast<double>(available_kb) / 1024);
      break;
    }
  }
  return 0;
}

}  // namespace

HF_REGISTER_WORKER(BenchWorker, "bench_runtime_worker");

int main(int argc, char** argv) {
  run_worker_if_requested();
  at::set_num_threads(1);
  const int calls = static_cast<int>(bench::arg_int(argc, argv, "calls", 300));
  const int64_t mb = bench::arg_int(argc, argv, "mb", 64);
  const int reps = static_cast<int>(bench::arg_int(argc, argv, "reps", 5));
  if (const int fanout = static_cast<int>(bench::arg_int(argc, argv, "fanout", 0)); fanout > 0)
    return fanout_curve(fanout, std::min(calls, 100));

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
