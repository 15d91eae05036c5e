// A TCP port for a test job's rendezvous (tests/runtime/launch_test_job.h, tests/apps/test_launch_cli.cpp).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>
#include <stdexcept>

namespace hybridflow::testing {

// A port for a job's rendezvous, chosen below the kernel's ephemeral range (32768+ on Linux): a port
// the kernel handed out and took back could go to any outgoing connection of a test running beside
// this one before the job binds it (CI saw "Address already in use"). Ports below that range are only
// ever taken on purpose, so a random one that binds now stays free.
inline int free_tcp_port() {
  static std::mt19937 pick(std::random_device{}() ^ static_cast<unsigned>(::getpid()));
  std::uniform_int_distribution<int> range(20000, 32000);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = range(pick);
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) continue;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    if (free) return port;
  }
  throw std::runtime_error("free_tcp_port: no free port in 20000-32000 after 200 tries");
}

}  // namespace hybridflow::testing
