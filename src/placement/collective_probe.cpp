#include "hybridflow/placement/collective_probe.h"

#include <ATen/ATen.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "hybridflow/core/error.h"
#include "hybridflow/parallel/process_group.h"
#include "hybridflow/parallel/store_server.h"

namespace hybridflow::placement {

namespace {

double best_allreduce_seconds(const ProcessGroup& group, int64_t elements, int reps) {
  at::Tensor t = at::ones({elements}, at::kFloat);
  group.allreduce(t, ReduceOp::kSum);  // warm-up: connections and buffers
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    group.barrier();
    const auto start = std::chrono::steady_clock::now();
    group.allreduce(t, ReduceOp::kSum);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

void run_rank(int rank, int ranks, int port, int64_t bytes, int reps, int result_fd) {
  LaunchEnv env;
  env.launcher = "calibration";
  env.rank = rank;
  env.world_size = ranks;
  env.master_port = port;
  ProcessGroupOptions options;
  options.backend = "gloo";
  options.rank0_hosts_store = false;
  const ProcessGroup group = ProcessGroup::create_world(env, options);
  // Best times at four sizes: 4 bytes, bytes / 64, bytes / 8, bytes.
  std::string line;
  for (int64_t size : {int64_t{4}, bytes / 64, bytes / 8, bytes})
    line += std::to_string(size) + " " + std::to_string(best_allreduce_seconds(group, std::max<int64_t>(1, size / 4), reps)) + " ";
  line += "\n";
  if (rank == 0 && ::write(result_fd, line.data(), line.size()) < 0) ::_exit(2);
}

}  // namespace

CollectiveProbe measure_local_allreduce(int ranks, int64_t bytes, int reps) {
  HF_CHECK(ranks >= 2, "measure_local_allreduce: needs at least 2 ranks, got ", ranks);
  const auto store = StoreServer::start(0, std::chrono::seconds(60), "127.0.0.1");
  int fds[2];
  HF_CHECK(::pipe(fds) == 0, "measure_local_allreduce: pipe() failed");
  std::vector<pid_t> children;
  for (int rank = 0; rank < ranks; ++rank) {
    const pid_t pid = ::fork();
    HF_CHECK(pid >= 0, "measure_local_allreduce: fork() failed");
    if (pid == 0) {
      ::close(fds[0]);
      at::set_num_threads(1);
      int code = 0;
      try {
        run_rank(rank, ranks, store->port(), bytes, reps, fds[1]);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "calibration all-reduce rank %d: %s\n", rank, e.what());
        code = 1;
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    children.push_back(pid);
  }
  ::close(fds[1]);
  std::string out;
  char buf[256];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  HF_CHECK(failed == 0, "measure_local_allreduce: ", failed, " of ", ranks, " ranks failed");
  // The ring model t = 2 (n - 1) alpha + 2 (n - 1) / n x size / bandwidth, fitted by least squares.
  std::vector<double> sizes, times;
  std::istringstream in(out);
  for (double s, t; in >> s >> t;) sizes.push_back(s), times.push_back(t);
  HF_CHECK(sizes.size() == 4, "measure_local_allreduce: no timing from rank 0 (got '", out, "')");
  const double steps = 2.0 * (ranks - 1);
  double mx = 0, my = 0;
  for (size_t i = 0; i < 4; ++i) mx += steps / ranks * sizes[i] / 4, my += times[i] / 4;
  double sxy = 0, sxx = 0;
  for (size_t i = 0; i < 4; ++i) {
    const double x = steps / ranks * sizes[i] - mx;
    sxy += x * (times[i] - my);
    sxx += x * x;
  }
  const double per_byte = sxx > 0 ? sxy / sxx : 0;
  CollectiveProbe p;
  p.bus_bandwidth = per_byte > 0 ? 1.0 / per_byte : steps / ranks * sizes[3] / times[3];
  p.latency_s = std::max(0.0, my - per_byte * mx) / steps;
  if (p.latency_s == 0) p.latency_s = times[0] / steps;
  return p;
}

}  // namespace hybridflow::placement
