// A job for the launch tests (torchrun / srun environments, mpirun, network namespaces): the test
// starts this binary world_size times with a launcher's environment; the controller rank runs the job
// below, every other rank becomes a worker through run_worker_if_requested(). Include from exactly
// one file per test binary, instead of runtime_test_workers.h.
#pragma once

#include <ifaddrs.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#include <unistd.h>

#include <optional>
#include <random>
#include <stdexcept>

#include "hybridflow/runtime/protocol.h"
#include "support/free_tcp_port.h"
#include "hybridflow/runtime/worker.h"
#include "transport/launcher_detail.h"

namespace {

// Where a worker runs: its launcher rank, pid, network namespace and IPv4 addresses.
class WhereWorker : public hybridflow::Worker {
 public:
  void register_methods(hybridflow::MethodTable& table) override {
    table.add("where", hybridflow::protocols::kOneToAll, [](const hybridflow::DataProto&) {
      char ns[128] = {0};
      ssize_t n = ::readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
      std::vector<std::string> addrs;
      ifaddrs* list = nullptr;
      if (::getifaddrs(&list) == 0) {
        for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
          if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
          char text[INET_ADDRSTRLEN] = {0};
          ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof(text));
          if (std::string(text) != "127.0.0.1") addrs.push_back(text);
        }
        ::freeifaddrs(list);
      }
      auto env = [](const char* key) { return std::string(std::getenv(key) ? std::getenv(key) : ""); };
      hybridflow::DataProto out;
      out.set_field("where", {nlohmann::json{{"launch_rank", env("HF_LAUNCH_RANK")},
                                             {"controller_addr", env("HF_CONTROLLER_ADDR")},
                                             {"pid", static_cast<int64_t>(::getpid())},
                                             {"netns", std::string(ns, n > 0 ? n : 0)},
                                             {"addrs", addrs}}});
      return out;
    });
  }
};

}  // namespace

HF_REGISTER_WORKER(WhereWorker, "where");

#include "runtime/runtime_test_workers.h"

namespace {

std::string env_or(const char* key, const std::string& fallback) {
  const char* v = std::getenv(key);
  return v ? v : fallback;
}

// HF_TEST_LAUNCH_JOB = pools | crash | die | die_early | too_many; HF_TEST_POOL_SIZES = "2,1" (pools
// p0, p1, ...); the outcome goes to HF_TEST_RESULT as JSON.
void run_launch_job(const std::string& mode, nlohmann::json& result) {
  if (mode == "die_early") {
    std::this_thread::sleep_for(std::chrono::seconds(1));  // the worker ranks have joined and wait
    ::_exit(9);
  }
  std::vector<ResourcePool> specs;
  std::stringstream sizes(env_or("HF_TEST_POOL_SIZES", "2"));
  for (std::string n; std::getline(sizes, n, ',');) {
    specs.push_back(pool_spec("p" + std::to_string(specs.size()), std::stoi(n)));
    specs.back().start_timeout_s = std::stod(env_or("HF_TEST_START_TIMEOUT_S", "30"));
    // An allowed key reaches the pool's ranks; any other key is not applied by a launched worker.
    specs.back().env["MKL_NUM_THREADS"] = std::to_string(10 + specs.size());
    specs.back().env["HF_TEST_POOL_MARK"] = specs.back().name;
  }
  Controller ctl;
  auto pools = ctl.add_pools(specs);
  if (mode == "crash" || mode == "die") {
    auto group = ctl.create_group("p0", "actor", "echo");
    result["pids"] = pools[0]->pids();
    write_file_atomic(env_or("HF_TEST_RESULT", ""), result.dump());
    if (mode == "die") ::kill(::getpid(), SIGKILL);
    group.call("crash").get();
    return;
  }
  std::vector<WorkerGroup> where;
  for (const auto& spec : specs) where.push_back(ctl.create_group(spec.name, "where", "where"));
  for (size_t i = 0; i < specs.size(); ++i) {
    result["where"][specs[i].name] = where[i].call("where").get().field("where");
    WorkerGroup echo = ctl.create_group(specs[i].name, "echo", "echo");
    DataProto ask;
    ask.meta()["name"] = "MKL_NUM_THREADS";
    result["mark"][specs[i].name] = echo.call("getenv", ask).get().field("value");
    ask.meta()["name"] = "HF_TEST_POOL_MARK";
    result["not_allowed"][specs[i].name] = echo.call("getenv", ask).get().field("value");
  }
  // Data flows through both pools: doubled on p0 (split across its ranks), plus one on p1.
  WorkerGroup actor = ctl.create_group("p0", "actor", "echo");
  WorkerGroup critic = ctl.create_group(specs.size() > 1 ? "p1" : "p0", "critic", "plus_one");
  Future doubled = actor.call("double", batch(6));
  result["z"] = longs(critic.call("add_one", doubled).get().tensor("z"));
  result["y_rank"] = longs(doubled.get().tensor("rank"));
}

bool run_launch_job_if_requested() {
  const char* mode = std::getenv("HF_TEST_LAUNCH_JOB");
  if (!mode) return false;
  nlohmann::json result = nlohmann::json::object();
  int code = 0;
  try {
    run_launch_job(mode, result);
  } catch (const std::exception& e) {
    result["error"] = e.what();
    code = 1;
  }
  if (auto* rendezvous = transport_detail::launch_rendezvous()) result["rejected"] = rendezvous->rejected_messages();
  write_file_atomic(env_or("HF_TEST_RESULT", ""), result.dump());
  std::exit(code);  // not _Exit: the launch's exit hook releases the ranks no pool used
}

}  // namespace

static const bool kRanLaunchJob = run_launch_job_if_requested();

namespace {

// Starts argv[0] with the test process's environment plus `extra` (which wins).
inline pid_t spawn_with(const std::vector<std::string>& args, const std::map<std::string, std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    if (!extra.count(kv.substr(0, kv.find('=')))) env.push_back(kv);
  }
  for (const auto& [k, v] : extra) env.push_back(k + "=" + v);
  std::vector<char*> envp, argv;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> copy = args;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  int rc = ::posix_spawnp(&pid, copy[0].c_str(), nullptr, nullptr, argv.data(), envp.data());
  EXPECT_EQ(rc, 0) << "cannot start " << args[0];
  return rc == 0 ? pid : -1;
}

// The exit status of `pid`, or nullopt after killing it when it is still running after `seconds`.
inline std::optional<int> wait_exit(pid_t pid, double seconds) {
  auto t0 = std::chrono::steady_clock::now();
  while (true) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return status;
    if (seconds_since(t0) > seconds) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return std::nullopt;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

inline int exit_code(const std::optional<int>& status) {
  if (!status) return -1000;  // still running: killed
  if (WIFEXITED(*status)) return WEXITSTATUS(*status);
  return -WTERMSIG(*status);
}

// Every process of a test job: waits for all (killing stragglers), also when an assertion fails.
struct Job {
  std::vector<pid_t> pids;
  std::vector<std::optional<int>> statuses;
  void wait_all(double seconds) {
    auto t0 = std::chrono::steady_clock::now();
    statuses.clear();
    for (pid_t pid : pids) statuses.push_back(wait_exit(pid, std::max(0.1, seconds - seconds_since(t0))));
    pids.clear();
  }
  int code(size_t i) const { return exit_code(statuses.at(i)); }
  ~Job() { wait_all(0); }
};

using hybridflow::testing::free_tcp_port;

inline std::string self_exe() {
  char buf[4096] = {0};
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return std::string(buf, n > 0 ? n : 0);
}

inline nlohmann::json read_result(const std::string& path) {
  if (!file_exists(path)) return nlohmann::json{{"error", "no result file " + path}};
  return nlohmann::json::parse(read_file(path));
}

}  // namespace
