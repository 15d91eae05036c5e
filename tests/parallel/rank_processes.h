// Runs a function in n forked processes, one per rank, with a deadline; the children fork before any torch
// work, use one thread and report gtest failures through their exit status.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "hybridflow/parallel/process_group.h"

namespace hybridflow::testing {

// A TCP port that was free a moment ago on 127.0.0.1 (the kernel picks it when binding port 0).
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// A child's exit status when its rank could not join the group (a rendezvous that failed): the port, free when
// free_port() chose it, can be taken by another test's processes running beside this one before rank 0 binds
// it, and their ranks then meet in one store. run_ranks tries again on a fresh port.
constexpr int kRendezvousFailed = 3;

// fn(rank, port) runs in each child; a gtest failure or exception there fails the test here. Children still
// running at the deadline are killed and the test fails. A rendezvous that fails is tried again, on a fresh
// port, up to twice.
inline void run_ranks(int n, const std::function<void(int rank, int port)>& fn, int deadline_s = 30) {
  for (int attempt = 0;; ++attempt) {
    const bool last = attempt == 2;
    int port = free_port();
    std::fflush(stdout);
    std::fflush(stderr);
    std::vector<pid_t> pids;
    for (int rank = 0; rank < n; ++rank) {
      pid_t pid = ::fork();
      ASSERT_GE(pid, 0) << "fork failed";
      if (pid == 0) {
        ::setenv("OMP_WAIT_POLICY", "passive", 1);
        at::set_num_threads(1);
        try {
          fn(rank, port);
        } catch (const std::exception& e) {
          const bool rendezvous = std::string(e.what()).find("process group: rendezvous") != std::string::npos;
          if (rendezvous && !last) {
            std::fprintf(stderr, "rank %d: %s\n(trying again on another port)\n", rank, e.what());
            std::fflush(stderr);
            ::_exit(kRendezvousFailed);
          }
          ADD_FAILURE() << "rank " << rank << " threw: " << e.what();
        }
        std::fflush(stdout);
        std::fflush(stderr);
        ::_exit(::testing::Test::HasFailure() ? 1 : 0);
      }
      pids.push_back(pid);
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(deadline_s);
    std::vector<bool> done(n, false);
    std::vector<int> statuses(n, 0);
    int remaining = n;
    bool retry = false;
    auto kill_remaining = [&] {
      for (int rank = 0; rank < n; ++rank)
        if (!done[rank]) {
          ::kill(pids[rank], SIGKILL);
          ::waitpid(pids[rank], nullptr, 0);
        }
    };
    while (remaining > 0) {
      for (int rank = 0; rank < n; ++rank) {
        if (done[rank]) continue;
        int status = 0;
        if (::waitpid(pids[rank], &status, WNOHANG) == pids[rank]) {
          done[rank] = true;
          statuses[rank] = status;
          --remaining;
          retry = retry || (WIFEXITED(status) && WEXITSTATUS(status) == kRendezvousFailed);
        }
      }
      if (retry) {  // the other ranks wait on a group that will not form
        kill_remaining();
        break;
      }
      if (remaining > 0 && std::chrono::steady_clock::now() > deadline) {
        for (int rank = 0; rank < n; ++rank)
          if (!done[rank]) ADD_FAILURE() << "rank " << rank << " still running after " << deadline_s << " s; killed";
        kill_remaining();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (retry) continue;
    for (int rank = 0; rank < n; ++rank)
      EXPECT_TRUE(WIFEXITED(statuses[rank]) && WEXITSTATUS(statuses[rank]) == 0)
          << "rank " << rank << " failed (status " << statuses[rank] << ")";
    return;
  }
}

// A Gloo world of `size` ranks on 127.0.0.1:port (call from run_ranks' children).
inline ProcessGroup gloo_world(int rank, int size, int port,
                               std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  LaunchEnv env;
  env.launcher = "test";
  env.rank = rank;
  env.world_size = size;
  env.master_addr = "127.0.0.1";
  env.master_port = port;
  ProcessGroupOptions options;
  options.backend = "gloo";
  options.timeout = timeout;
  return ProcessGroup::create_world(env, options);
}

}  // namespace hybridflow::testing
