// The c10d store has no authentication, so it must listen on the address it was
// given, never on every interface (docs/security.md). The kernel's socket table
// says where a socket really listens.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "hybridflow/parallel/launch_env.h"
#include "hybridflow/parallel/process_group.h"
#include "hybridflow/parallel/store_server.h"

namespace hybridflow {
namespace {

// The local addresses (hex, as /proc/net/tcp{,6} write them) of the sockets
// listening on `port`, IPv4 and IPv6: c10d's own server listens on "::", every
// interface of both families.
std::vector<std::string> listening_addresses(int port) {
  std::vector<std::string> found;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const size_t colon = local.find(':');
      if (state != "0A" || colon == std::string::npos) continue;  // 0A: LISTEN
      if (std::stoi(local.substr(colon + 1), nullptr, 16) == port) found.push_back(local.substr(0, colon));
    }
  }
  return found;
}

constexpr const char *kLoopbackHex = "0100007F"; // 127.0.0.1, little-endian

TEST(StoreListenAddress, StoreServerListensOnLoopbackOnly) {
  auto server = StoreServer::start(0, std::chrono::seconds(10), "127.0.0.1");
  const auto addresses = listening_addresses(server->port());
  ASSERT_EQ(addresses.size(), 1u) << "port " << server->port();
  EXPECT_EQ(addresses[0], kLoopbackHex);
}

TEST(StoreListenAddress, RankZeroHostsItsStoreOnMasterAddrOnly) {
  auto probe = StoreServer::start(0, std::chrono::seconds(10), "127.0.0.1");
  const int port = probe->port();
  probe.reset(); // a port that was free a moment ago
  LaunchEnv env;
  env.master_addr = "127.0.0.1";
  env.master_port = port;
  ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(10);
  ProcessGroup world = ProcessGroup::create_world(env, options);
  const auto addresses = listening_addresses(port);
  ASSERT_EQ(addresses.size(), 1u) << "port " << port;
  EXPECT_EQ(addresses[0], kLoopbackHex);
  EXPECT_EQ(world.size(), 1);
}

} // namespace
} // namespace hybridflow
