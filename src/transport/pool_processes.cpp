// Spawning a pool's workers, watching them (exits, overdue calls, silence) and reaping them.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "hybridflow/core/error.h"
#include "hybridflow/core/logging.h"
#include "launcher_detail.h"
#include "pool_impl.h"

extern char** environ;

namespace hybridflow {

namespace transport_detail {

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
                                  ::strsignal(WTERMSIG(status)) + ")";
  return "stopped with status " + std::to_string(status);
}

}  // namespace transport_detail

using transport_detail::describe_exit;
using transport_detail::register_pgid;

std::string ProcessPool::Impl::where(int rank) const {
  const auto& r = ranks[rank];
  if (!launch_ranks.empty())
    return detail::concat("rank ", rank, " (launcher rank ", launch_ranks[rank], ", pid ", r.pid, " on host ", r.host, ")");
  return detail::concat("rank ", rank, " (pid ", r.pid, " on host ", r.host, ")");
}

// What `rank` was busy with, for failure messages.
std::string ProcessPool::Impl::running_on(int rank) const {
  std::string out;
  for (const auto& kv : pending)
    if (kv.second.addressed[rank] && !kv.second.replies[rank])
      out += (out.empty() ? "" : ", ") + kv.second.role + "." + kv.second.method;
  return out.empty() ? "while idle" : "while running method " + out;
}

void ProcessPool::Impl::spawn() {
  const std::string exe = spec.executable.empty() ? "/proc/self/exe" : spec.executable;
  std::vector<std::string> base_env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    std::string key = kv.substr(0, kv.find('='));
    if (key.rfind("HF_WORKER_", 0) != 0 && key != kControllerAddrEnv && key != "LOCAL_RANK" && !spec.env.count(key))
      base_env.push_back(kv);
  }
  for (const auto& kv : spec.env) base_env.push_back(kv.first + "=" + kv.second);
  const pid_t parent = ::getpid();
  // argv[0] is what `ps` shows: "hybridflow worker <pool> rank <r>", so a user can tell the processes apart.
  std::string program = "hybridflow";
  try {
    program = std::filesystem::canonical(exe).filename().string();
  } catch (const std::exception&) {
  }
  for (int rank = 0; rank < spec.num_processes; ++rank) {
    // Everything the child needs is built before fork: after fork only async-signal-safe calls.
    std::vector<std::string> env = base_env;
    env.push_back(std::string(transport_detail::kEndpointEnv) + "=" + endpoint);
    env.push_back(std::string(transport_detail::kTokenEnv) + "=" + token);
    env.push_back(std::string(transport_detail::kDataTokenEnv) + "=" + data_token);
    env.push_back(std::string(transport_detail::kRankEnv) + "=" + std::to_string(rank));
    env.push_back(std::string(transport_detail::kPoolEnv) + "=" + spec.name);
    env.push_back(std::string(kControllerAddrEnv) + "=" + spec.bind_host);
    if (!spec.env.count("LOCAL_RANK")) env.push_back("LOCAL_RANK=" + std::to_string(spec.local_rank_offset + rank));
    std::vector<char*> envp, argv;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string arg0 = program + " worker " + spec.name + " rank " + std::to_string(rank);
    std::vector<std::string> args = spec.args;
    argv.push_back(arg0.data());
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int group = pgid;
    pid_t pid = ::fork();
    if (pid < 0) HF_FAIL("resource pool '", spec.name, "': fork failed: ", std::strerror(errno));
    if (pid == 0) {
      ::setpgid(0, group);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // die with the controller's I/O thread, whatever happens
      if (::getppid() != parent) ::_exit(1);
      ::execve(exe.c_str(), argv.data(), envp.data());
      ::_exit(127);
    }
    ::setpgid(pid, group == 0 ? pid : group);  // also in the parent: no race with the first kill
    std::lock_guard<std::mutex> lock(mutex);
    if (pgid == 0) {
      pgid = pid;
      register_pgid(pgid);
    }
    ranks[rank].pid = pid;
    ranks[rank].last_seen = Clock::now();
  }
}

void ProcessPool::Impl::kill_and_reap_all() {
  if (!spec.spawn_workers) return;  // not our children (maybe not even on this host)
  std::vector<int> pids;
  int group;
  {
    std::lock_guard<std::mutex> lock(mutex);
    group = pgid;
    for (auto& r : ranks)
      if (r.alive && r.pid > 0) pids.push_back(r.pid);
  }
  if (group > 0) ::kill(-group, SIGKILL);
  for (int pid : pids) ::kill(pid, SIGKILL);
  for (int pid : pids) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  std::lock_guard<std::mutex> lock(mutex);
  for (auto& r : ranks) r.alive = false;
}

void ProcessPool::Impl::fail(const std::string& message) {
  std::map<int64_t, Pending> failed;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!failure.empty()) return;
    failure = message;
    failed.swap(pending);
  }
  log_error(message);
  kill_and_reap_all();
  {
    std::lock_guard<std::mutex> lock(mutex);
    failure_handled = true;
  }
  cv.notify_all();
  for (auto& kv : failed) kv.second.on_error(std::make_exception_ptr(Error(message)));
}

std::string ProcessPool::Impl::check_health() {
  std::lock_guard<std::mutex> lock(mutex);
  const auto now = Clock::now();
  for (size_t r = 0; r < ranks.size(); ++r) {
    auto& rank = ranks[r];
    if (!spec.spawn_workers || !rank.alive || rank.pid <= 0) continue;
    int status = 0;
    if (::waitpid(rank.pid, &status, WNOHANG) == rank.pid) {
      rank.alive = false;
      link->forget_peer(static_cast<int>(r));  // closes the files of calls it will never answer
      if (exiting) continue;
      return detail::concat("resource pool '", spec.name, "': worker ", where(r), " ", describe_exit(status), " ",
                            running_on(static_cast<int>(r)));
    }
  }
  if (exiting) return "";
  for (const auto& kv : pending) {
    if (now < kv.second.deadline) continue;
    std::string ranks_left;
    for (size_t r = 0; r < ranks.size(); ++r)
      if (kv.second.addressed[r] && !kv.second.replies[r])
        ranks_left += (ranks_left.empty() ? "" : ", ") + where(static_cast<int>(r));
    return detail::concat("resource pool '", spec.name, "': call '", kv.second.role, ".", kv.second.method,
                          "' timed out after ", spec.call_timeout_s, " s (call_timeout_s); still running on ",
                          ranks_left);
  }
  for (size_t r = 0; r < ranks.size(); ++r) {
    const auto& rank = ranks[r];
    if (!rank.connected) continue;
    double silent = std::chrono::duration<double>(now - rank.last_seen).count();
    if (silent > spec.heartbeat_timeout_s)
      return detail::concat("resource pool '", spec.name, "': no heartbeat from worker ", where(static_cast<int>(r)),
                            " for ", silent, " s ", running_on(static_cast<int>(r)));
  }
  return "";
}

}  // namespace hybridflow
