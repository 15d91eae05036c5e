// Worker classes and helpers shared by the runtime's process tests. Each test binary that includes
// this re-executes itself as the worker processes (run_worker_if_requested below), so every check
// runs the real spawn / ZeroMQ / protocol path. Include from exactly one file per test binary.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>
#include <zmq.hpp>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "support/temp_dir.h"
#include "hybridflow/runtime/controller.h"
#include "hybridflow/runtime/protocol.h"
#include "hybridflow/runtime/worker.h"
#include "hybridflow/runtime/worker_main.h"

using namespace hybridflow;

namespace {

DataProto pid_row(const Worker& w) {
  DataProto d;
  d.set_tensor("pid", torch::full({1}, static_cast<int64_t>(::getpid()), torch::kLong));
  d.set_tensor("rank", torch::full({1}, static_cast<int64_t>(w.rank()), torch::kLong));
  return d;
}

class EchoWorker : public Worker {
 public:
  void register_methods(MethodTable& table) override {
    table.add("double", protocols::kDataParallel, this, &EchoWorker::twice);
    table.add("pid", protocols::kOneToAll, [this](const DataProto&) { return pid_row(*this); });
    table.add("sleep", protocols::kOneToAll, [this](const DataProto& in) {
      std::this_thread::sleep_for(std::chrono::milliseconds(in.meta().value("sleep_ms", 0)));
      return pid_row(*this);
    });
    table.add("getenv", protocols::kOneToAll, [](const DataProto& in) {
      const char* v = std::getenv(in.meta().at("name").get<std::string>().c_str());
      DataProto out;
      out.set_field("value", {v ? nlohmann::json(v) : nlohmann::json()});
      return out;
    });
    table.add("crash", protocols::kOneToAll, [this](const DataProto&) {
      if (rank() == 1) ::_exit(3);
      return pid_row(*this);
    });
    table.add("hang", protocols::kOneToAll, [this](const DataProto&) {
      if (rank() == 1) std::this_thread::sleep_for(std::chrono::hours(1));
      return pid_row(*this);
    });
    table.add("fail", protocols::kOneToAll, [this](const DataProto&) -> DataProto {
      if (rank() == 1) HF_FAIL("bad input on purpose");
      return pid_row(*this);
    });
  }

  DataProto twice(const DataProto& in) {
    DataProto out;
    out.set_tensor("y", in.tensor("x") * 2);
    out.set_tensor("rank", torch::full({in.batch_size()}, static_cast<int64_t>(rank()), torch::kLong));
    return out;
  }
};

class PlusOneWorker : public Worker {
 public:
  void register_methods(MethodTable& table) override {
    table.add("add_one", protocols::kDataParallel, [](const DataProto& in) {
      DataProto out;
      out.set_tensor("z", in.tensor("y") + 1);
      return out;
    });
    table.add("pid", protocols::kOneToAll, [this](const DataProto&) { return pid_row(*this); });
  }
};

// Per-rank answers of every shape a reply can take, for comparing calls batched per worker process with calls
// sent to each rank alone (ResourcePool::batch_calls): tensors, fields and meta that differ by rank, a result
// too big to merge, errors on chosen ranks, and a count of the calls each rank ran, in the order it ran them.
class RankProbeWorker : public Worker {
 public:
  void register_methods(MethodTable& table) override {
    table.add("describe", protocols::kOneToAll, [this](const DataProto& in) {
      // Asked for: 4,096 rows on even ranks (160 KiB: travels on its own connection), else one.
      const int64_t rows = in.meta().value("big_on_even", false) && rank() % 2 == 0 ? 4096 : 1;
      DataProto out;
      out.set_tensor("rank", torch::full({rows}, static_cast<int64_t>(rank()), torch::kLong));
      out.set_tensor("wide", torch::full({rows, 8}, static_cast<float>(rank())));
      if (in.has_tensor("x")) out.set_tensor("x_plus_rank", (in.tensor("x") + rank()).reshape({1, -1}).expand({rows, -1}).contiguous());
      out.set_field("name", std::vector<nlohmann::json>(static_cast<size_t>(rows), "rank " + std::to_string(rank())));
      out.meta()["rank"] = rank();
      out.meta()["world"] = world_size();
      out.meta()["asked"] = in.meta();
      return out;
    });
    // Writes to its input: another rank's input must not change with it.
    table.add("scribble", protocols::kOneToAll, [](const DataProto& in) {
      in.tensor("x").add_(1);
      DataProto out;
      out.set_tensor("x", in.tensor("x").clone().reshape({1, -1}));
      return out;
    });
    table.add("empty", protocols::kOneToAll, [](const DataProto&) { return DataProto(); });
    table.add("fail_on", protocols::kOneToAll, [this](const DataProto& in) {
      if (rank() == in.meta().at("rank").get<int>()) HF_FAIL("rank ", rank(), " fails on purpose");
      return DataProto();
    });
    table.add("sleep", protocols::kOneToAll, [](const DataProto& in) {
      std::this_thread::sleep_for(std::chrono::milliseconds(in.meta().value("sleep_ms", 0)));
      return DataProto();
    });
    // The how-manieth call of this rank: one-to-all (one row) and data-parallel (one per row of its shard).
    table.add("ordinal", protocols::kOneToAll, [this](const DataProto&) {
      DataProto out;
      out.set_tensor("ordinal", torch::full({1}, ++calls_, torch::kLong));
      return out;
    });
    table.add("ordinal_rows", protocols::kDataParallel, [this](const DataProto& in) {
      DataProto out;
      out.set_tensor("ordinal", torch::full({in.batch_size()}, ++calls_, torch::kLong));
      return out;
    });
  }

 private:
  int64_t calls_ = 0;
};

}  // namespace

HF_REGISTER_WORKER(EchoWorker, "echo");
HF_REGISTER_WORKER(RankProbeWorker, "rank_probe");
HF_REGISTER_WORKER(PlusOneWorker, "plus_one");
// In a spawned worker process this serves the controller and exits; in the test process it is a no-op.
static const bool kRanAsWorker = run_worker_if_requested();

namespace {
// A whole job in a child of the test process, so the tests can interrupt or crash a controller:
// HF_TEST_JOB=sigint|crash, HF_TEST_PID_FILE=<where to write the worker pids>.
bool run_job_if_requested() {
  const char* mode = std::getenv("HF_TEST_JOB");
  if (!mode) return false;
  Controller ctl;
  ResourcePool spec;
  spec.name = "job";
  spec.num_processes = 2;
  auto pool = ctl.add_pool(spec);
  auto group = ctl.create_group("job", "actor", "echo");
  std::string pids;
  for (int pid : pool->pids()) pids += std::to_string(pid) + " ";
  write_file_atomic(std::getenv("HF_TEST_PID_FILE"), pids);
  if (std::string(mode) == "crash") group.call("crash").get();  // uncaught: the job dies with it
  std::this_thread::sleep_for(std::chrono::seconds(60));      // until the test interrupts us
  std::_Exit(0);
}
}  // namespace
static const bool kRanAsJob = run_job_if_requested();

namespace {

inline ResourcePool pool_spec(const std::string& name, int n) {
  ResourcePool spec;
  spec.name = name;
  spec.num_processes = n;
  spec.start_timeout_s = 30;
  spec.call_timeout_s = 30;
  return spec;
}

inline DataProto batch(int64_t n) {
  DataProto d;
  d.set_tensor("x", torch::arange(n, torch::kFloat));
  return d;
}

inline std::vector<int64_t> longs(const torch::Tensor& t) {
  auto c = t.contiguous().to(torch::kLong);
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// Gone or a zombie (dead, waiting for its new parent to reap it).
inline bool process_gone(int pid) {
  if (::kill(pid, 0) == -1 && errno == ESRCH) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  auto paren = line.rfind(')');
  return paren == std::string::npos || (paren + 2 < line.size() && line[paren + 2] == 'Z');
}

inline bool all_gone_within(const std::vector<int>& pids, double seconds) {
  auto t0 = std::chrono::steady_clock::now();
  while (true) {
    bool gone = true;
    for (int pid : pids) gone = gone && process_gone(pid);
    if (gone) return true;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Starts this binary as a job (see run_job_if_requested); returns its pid and its workers' pids.
inline std::pair<int, std::vector<int>> start_job(const std::string& mode, const std::string& pid_file) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.push_back(*e);
  env.push_back("HF_TEST_JOB=" + mode);
  env.push_back("HF_TEST_PID_FILE=" + pid_file);
  std::vector<char*> envp;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe";
  char* argv[] = {exe.data(), nullptr};
  pid_t job = 0;
  EXPECT_EQ(::posix_spawn(&job, exe.c_str(), nullptr, nullptr, argv, envp.data()), 0);
  std::vector<int> workers;
  auto t0 = std::chrono::steady_clock::now();
  while (workers.empty() && std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 30) {
    if (file_exists(pid_file)) {
      std::istringstream in(read_file(pid_file));
      for (int pid; in >> pid;) workers.push_back(pid);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return {job, workers};
}

inline std::string message_of(const Future& f) {
  try {
    f.get();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

