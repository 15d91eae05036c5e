// Two resource pools, three roles: "actor" and "ref" colocated in pool_a (2 processes), "reward" in
// pool_b (1 process). Shows a data-parallel split, a Future chained from pool_a into pool_b, and
// concurrent calls on both pools, then prints what ran where. This binary is also its own worker:
// the controller re-executes it, and run_worker_if_requested() turns that copy into a worker.
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "hybridflow/runtime/controller.h"
#include "hybridflow/runtime/protocol.h"
#include "hybridflow/runtime/worker.h"
#include "hybridflow/runtime/worker_main.h"

using namespace hybridflow;

namespace {

// Wall-clock seconds: all processes run on this host, so their timestamps compare directly.
double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {0};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// Adds per-row provenance (who computed these rows, when) to a worker's output.
void stamp(DataProto& out, const Worker& w, int64_t rows, double start) {
  out.set_tensor("pid", torch::full({rows}, static_cast<int64_t>(::getpid()), torch::kLong));
  out.set_tensor("rank", torch::full({rows}, static_cast<int64_t>(w.rank()), torch::kLong));
  out.set_tensor("start", torch::full({rows}, start, torch::kDouble));
  out.set_tensor("end", torch::full({rows}, wall_now(), torch::kDouble));
  out.set_field("host", std::vector<nlohmann::json>(rows, host_name()));
  out.set_field("role", std::vector<nlohmann::json>(rows, w.context().role));
  out.set_field("pool", std::vector<nlohmann::json>(rows, w.context().pool));
}

// Methods every demo role has: "whoami" (one row per rank) and "busy" (sleeps meta.sleep_ms).
class DemoWorker : public Worker {
 public:
  void register_methods(MethodTable& table) override {
    table.add("whoami", protocols::kOneToAll, [this](const DataProto&) {
      DataProto out;
      stamp(out, *this, 1, wall_now());
      return out;
    });
    table.add("busy", protocols::kOneToAll, [this](const DataProto& in) {
      const double start = wall_now();
      std::this_thread::sleep_for(std::chrono::milliseconds(in.meta().value("sleep_ms", 0)));
      DataProto out;
      stamp(out, *this, 1, start);
      return out;
    });
    register_compute(table);
  }

 protected:
  virtual void register_compute(MethodTable&) {}
};

// The one role doing tensor work: a tiny "policy" scoring each row of x.
class ActorWorker : public DemoWorker {
 protected:
  void register_compute(MethodTable& table) override {
    table.add("score", protocols::kDataParallel, [this](const DataProto& in) {
      const double start = wall_now();
      torch::NoGradGuard no_grad;
      const torch::Tensor& x = in.tensor("x");
      auto w = torch::ones({x.size(1), 16}) / static_cast<double>(x.size(1));
      DataProto out;
      out.set_tensor("score", torch::tanh(torch::matmul(x, w)).sum(1));
      stamp(out, *this, x.size(0), start);
      return out;
    });
  }
};

class RewardWorker : public DemoWorker {
 protected:
  void register_compute(MethodTable& table) override {
    table.add("reward", protocols::kDataParallel, [this](const DataProto& in) {
      const double start = wall_now();
      DataProto out;
      out.set_tensor("reward", (in.tensor("score") > 0).to(torch::kFloat));
      stamp(out, *this, in.batch_size(), start);
      return out;
    });
  }
};

struct Row {
  std::string role, pool, host, call;
  int64_t rank = 0, pid = 0, rows = 0;
  double ms = 0;
};

// One table row per rank that contributed to `out`: rows with equal (role, rank) are one rank's work.
void collect_rows(const Future& f, const std::string& call, std::vector<Row>& table) {
  for (const DataProto& part : f.per_rank()) {
    if (part.batch_size() == 0) continue;
    Row r;
    r.role = part.field("role")[0].get<std::string>();
    r.pool = part.field("pool")[0].get<std::string>();
    r.host = part.field("host")[0].get<std::string>();
    r.call = call;
    r.rank = part.tensor("rank")[0].item<int64_t>();
    r.pid = part.tensor("pid")[0].item<int64_t>();
    r.rows = part.batch_size();
    r.ms = (part.tensor("end")[0].item<double>() - part.tensor("start")[0].item<double>()) * 1e3;
    table.push_back(r);
  }
}

// [earliest start, latest end] of all ranks of a call.
std::pair<double, double> span_of(const Future& f) {
  const DataProto& m = f.get();
  return {m.tensor("start").min().item<double>(), m.tensor("end").max().item<double>()};
}

ResourcePool pool_spec(const std::string& name, int n) {
  ResourcePool spec;
  spec.name = name;
  spec.num_processes = n;
  spec.env["OMP_NUM_THREADS"] = "1";
  spec.start_timeout_s = 60;
  spec.call_timeout_s = 60;
  return spec;
}

}  // namespace

HF_REGISTER_WORKER(ActorWorker, "demo_actor");
HF_REGISTER_WORKER(DemoWorker, "demo_ref");
HF_REGISTER_WORKER(RewardWorker, "demo_reward");

int main() {
  run_worker_if_requested();  // in a spawned copy: serve the controller, never return
  at::set_num_threads(1);
  const auto t0 = std::chrono::steady_clock::now();

  Controller ctl;
  ctl.add_pools({pool_spec("pool_a", 2), pool_spec("pool_b", 1)});  // start-ups overlap
  WorkerGroup actor = ctl.create_group("pool_a", "actor", "demo_actor");
  WorkerGroup ref = ctl.create_group("pool_a", "ref", "demo_ref");  // same processes as actor
  WorkerGroup reward = ctl.create_group("pool_b", "reward", "demo_reward");
  const double startup_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::vector<Row> table;
  collect_rows(actor.call("whoami"), "whoami", table);
  collect_rows(ref.call("whoami"), "whoami", table);
  collect_rows(reward.call("whoami"), "whoami", table);

  // DP split: 8 rows over pool_a's 2 ranks (4 each); the reward call is dispatched by the pool when
  // `scores` resolves, while the controller already goes on.
  DataProto batch;
  batch.set_tensor("x", torch::randn({8, 32}));
  Future scores = actor.call("score", batch);
  Future rewards = reward.call("reward", scores);
  collect_rows(scores, "score (DP)", table);
  collect_rows(rewards, "reward <- score", table);

  // Concurrent calls on both pools: each sleeps 300 ms; different pools overlap in time.
  DataProto sleep;
  sleep.meta()["sleep_ms"] = 300;
  const auto tc = std::chrono::steady_clock::now();
  Future busy_a = actor.call("busy", sleep);
  Future busy_b = reward.call("busy", sleep);
  wait_all({busy_a, busy_b});
  const double concurrent_ms = std::chrono::duration<double>(std::chrono::steady_clock::now() - tc).count() * 1e3;
  collect_rows(busy_a, "busy 300ms", table);
  collect_rows(busy_b, "busy 300ms", table);

  std::printf("pools started in %.2f s (pool_a: %zu processes, pool_b: %zu)\n\n", startup_s,
              actor.pool().pids().size(), reward.pool().pids().size());
  std::printf("%-7s %-5s %-8s %-7s %-16s %-16s %5s %9s\n", "role", "rank", "pid", "pool", "host", "call", "rows",
              "elapsed");
  for (const Row& r : table) {
    std::printf("%-7s %-5lld %-8lld %-7s %-16.16s %-16s %5lld %7.2fms\n", r.role.c_str(),
                static_cast<long long>(r.rank), static_cast<long long>(r.pid), r.pool.c_str(), r.host.c_str(),
                r.call.c_str(), static_cast<long long>(r.rows), r.ms);
  }

  const auto a = span_of(busy_a);
  const auto b = span_of(busy_b);
  const double overlap_ms = std::max(0.0, std::min(a.second, b.second) - std::max(a.first, b.first)) * 1e3;
  std::printf("\nconcurrent busy calls: pool_a %.1f ms, pool_b %.1f ms, overlap %.1f ms, controller waited %.1f ms\n",
              (a.second - a.first) * 1e3, (b.second - b.first) * 1e3, overlap_ms, concurrent_ms);

  const auto& rw = rewards.get().tensor("reward");
  std::printf("rewards of the 8 rows (from pool_b, computed on pool_a's scores): %lld positive\n",
              static_cast<long long>(rw.sum().item<float>()));
  ctl.shutdown();
  return overlap_ms > 0 ? 0 : 1;
}
