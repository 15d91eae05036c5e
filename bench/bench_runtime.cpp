// The controller's cost per call: an empty call's round trip (microseconds) and the throughput of
// dispatching a DataProto split across a worker group (DP_PROTO), for 2, 4 and 8 workers. Baseline,
// measured in the same run: the same payload serialized and deserialized inside one process (what a
// transport with zero overhead beyond one copy could reach). Then a result handed from one pool to
// another (a rollout to its readers): through the controller (HF_DATA_PLANE=0's path) vs the data plane,
// time and bytes. Workers are this binary, re-executed.
// --fanout N: only the fan-out curve instead: an empty call's round trip with 1, 2, 4 ... N workers (light
// ones: no model), and the memory they take (their resident anonymous memory, summed), so that a curve
// stops before the machine runs out of memory.
// --ranks_per_process=R (with --fanout): simulated workers, R ranks served by each worker process (threads
// with their own connection and key state, worker_main.h), so the curve reaches 1,024 ranks on a machine
// that has memory for a few dozen worker processes. The ranks of one process get a one-to-all call as one
// batch (ResourcePool::batch_calls); --batch=0 sends one message per rank instead, for comparison.
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <thread>
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

// CPU seconds (user + system, all threads) a process used so far; 0 once it is gone.
double child_cpu_seconds(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t end_of_name = stat.rfind(')');
  if (end_of_name == std::string::npos) return 0;
  std::istringstream fields(stat.substr(end_of_name + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i)
    if (i == 14 || i == 15) ticks += std::atof(field.c_str());  // utime, stime
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

extern "C" char** environ;

// 32 random bytes, hex, from /dev/urandom: the secret of a pool whose workers this benchmark starts itself.
std::string transport_secret_for_bench() {
  std::ifstream random("/dev/urandom", std::ios::binary);
  std::string out;
  for (int i = 0; i < 32; ++i) {
    char hex[3];
    std::snprintf(hex, sizeof(hex), "%02x", static_cast<unsigned char>(random.get()));
    out += hex;
  }
  return out;
}

// A loopback TCP port free right now (the simulated workers must know it before the pool listens).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("bench_runtime: no free port");
    std::exit(1);
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Worker processes serving ranks [first, first + count) of an external pool (spawn_workers = false).
std::vector<pid_t> start_simulated_workers(const ResourcePool& spec, int ranks_per_process) {
  std::vector<pid_t> pids;
  for (int first = 0; first < spec.num_processes; first += ranks_per_process) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e)
      if (std::string(*e).rfind("HF_WORKER_", 0) != 0) env.push_back(*e);
    env.push_back("HF_WORKER_ENDPOINT=tcp://127.0.0.1:" + std::to_string(spec.bind_port));
    env.push_back("HF_WORKER_TOKEN=" + spec.token);
    env.push_back("HF_WORKER_POOL=" + spec.name);
    env.push_back("HF_WORKER_RANK=" + std::to_string(first));
    env.push_back(std::string(kWorkerRankCountEnv) + "=" + std::to_string(std::min(ranks_per_process, spec.num_processes - first)));
    env.push_back("OMP_NUM_THREADS=1");
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    char exe[] = "/proc/self/exe";
    char* argv[] = {exe, nullptr};
    pid_t pid = 0;
    if (::posix_spawn(&pid, exe, nullptr, nullptr, argv, envp.data()) != 0) {
      std::perror("bench_runtime: cannot start simulated workers");
      std::exit(1);
    }
    pids.push_back(pid);
  }
  return pids;
}

// Simulated workers leave when the pool says shutdown; any still there after 10 s are killed.
void reap_simulated_workers(const std::vector<pid_t>& pids) {
  const double deadline = bench::now_seconds() + 10;
  std::set<pid_t> left(pids.begin(), pids.end());
  while (!left.empty()) {
    for (auto it = left.begin(); it != left.end();) it = ::waitpid(*it, nullptr, WNOHANG) == *it ? left.erase(it) : std::next(it);
    if (left.empty()) break;
    if (bench::now_seconds() > deadline) {
      for (pid_t pid : left) ::kill(pid, SIGKILL);
      for (pid_t pid : left) ::waitpid(pid, nullptr, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// The controller's cost of reaching every worker: an empty call's median round trip per group size.
// ranks_per_process > 0: simulated workers, that many ranks per worker process.
int fanout_curve(int max_workers, int calls, int ranks_per_process, bool batch_calls) {
  std::printf("%8s %16s %16s %14s %18s %16s %16s %18s\n", "workers", "empty call (us)", "p90 (us)", "us per worker",
              "controller CPU us", "workers' CPU us", "worker RSS (MB)", "RSS/worker (MB)");
  for (int workers = 1; workers <= max_workers; workers *= 2) {
    const int64_t available_kb = proc_kb("/proc/meminfo", "MemAvailable");
    Controller ctl;
    ResourcePool spec;
    spec.name = "fanout";
    spec.num_processes = workers;
    spec.start_timeout_s = 900;  // hundreds of processes loading libtorch on a few cores
    spec.env["OMP_NUM_THREADS"] = "1";
    spec.batch_calls = batch_calls;
    std::vector<pid_t> simulated;
    if (ranks_per_process > 0) {
      spec.spawn_workers = false;
      spec.token = transport_secret_for_bench();
      spec.bind_port = free_port();
      simulated = start_simulated_workers(spec, ranks_per_process);
    }
    ctl.add_pool(spec);
    WorkerGroup group = ctl.create_group("fanout", "fanout", "bench_runtime_worker");
    for (int i = 0; i < 10; ++i) group.call("noop").get();
    std::vector<double> us;
    std::vector<int> pids = ctl.pool("fanout")->pids();
    if (!simulated.empty()) pids.assign(simulated.begin(), simulated.end());
    auto workers_cpu = [&pids] {
      double sum = 0;
      for (int pid : pids) sum += child_cpu_seconds(pid);
      return sum;
    };
    const double workers_cpu_start = workers_cpu();
    const double cpu_start = process_cpu_seconds();
    for (int i = 0; i < calls; ++i) {
      const double t = bench::now_seconds();
      group.call("noop").get();
      us.push_back((bench::now_seconds() - t) * 1e6);
    }
    // The controller's own work per call (all its threads): what a tree of forwarders would divide.
    const double controller_cpu_us = (process_cpu_seconds() - cpu_start) / calls * 1e6;
    // The workers' side (all processes, 10 ms clock ticks: summed over the calls).
    const double workers_cpu_us = (workers_cpu() - workers_cpu_start) / calls * 1e6;
    std::sort(us.begin(), us.end());
    int64_t rss_kb = 0;
    for (int pid : pids) rss_kb += proc_kb("/proc/" + std::to_string(pid) + "/status", "RssAnon");
    const double median = us[us.size() / 2];
    std::printf("%8d %16.0f %16.0f %14.1f %18.0f %16.0f %16.0f %18.1f\n", workers, median, us[us.size() * 9 / 10],
                median / workers, controller_cpu_us, workers_cpu_us, static_cast<double>(rss_kb) / 1024,
                static_cast<double>(rss_kb) / 1024 / workers);
    std::fflush(stdout);
    ctl.shutdown();
    reap_simulated_workers(simulated);
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
    return fanout_curve(fanout, std::min(calls, 100),
                        static_cast<int>(bench::arg_int(argc, argv, "ranks_per_process", 0)),
                        bench::arg_int(argc, argv, "batch", 1) != 0);

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
