// "Hosts" for multi-host tests: network namespaces joined by veth pairs to a bridge in a switch
// namespace (so nothing is added to the machine's own network), each with an address on a random unused
// 10.x.y.0/24. Needs root and iproute2; a test skips when the first `ip netns add` fails.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace hybridflow::testing {

// Exit status of a shell command whose output is not wanted.
inline int sh_quiet(const std::string& command) { return std::system((command + " >/dev/null 2>&1").c_str()); }

inline std::string stdout_of(const std::string& command) {
  std::string out;
  if (FILE* pipe = ::popen(command.c_str(), "r")) {
    char buf[4096];
    while (size_t n = std::fread(buf, 1, sizeof(buf), pipe)) out.append(buf, n);
    ::pclose(pipe);
  }
  return out;
}

// A /24 prefix ("10.a.b.") that appears in none of this machine's addresses or routes; "" if none found.
inline std::string unused_subnet() {
  const std::string in_use = stdout_of("ip -o -4 addr show 2>/dev/null; ip -4 route show table all 2>/dev/null");
  std::mt19937 rng(std::random_device{}());
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string prefix = "10." + std::to_string(100 + rng() % 150) + "." + std::to_string(rng() % 256) + ".";
    if (in_use.find(prefix) == std::string::npos) return prefix;
  }
  return "";
}

// Namespaces created by one test, deleted (with anything still running in them) however it ends.
class NetnsHosts {
 public:
  NetnsHosts() = default;
  NetnsHosts(const NetnsHosts&) = delete;
  NetnsHosts& operator=(const NetnsHosts&) = delete;
  ~NetnsHosts() {
    for (const auto& ns : created_) {
      std::istringstream pids(stdout_of("ip netns pids " + ns + " 2>/dev/null"));
      for (int pid; pids >> pid;) ::kill(pid, SIGKILL);
    }
    for (const auto& ns : created_) sh_quiet("ip netns del " + ns);
  }

  bool add(const std::string& ns) {
    if (sh_quiet("ip netns add " + ns) != 0) return false;
    created_.push_back(ns);
    return true;
  }

  // Creates `hosts` on a bridge in `switch_ns` (already added) and returns their addresses in order
  // (host i gets .i+1 as eth0). Use under ASSERT_NO_FATAL_FAILURE: a failed step fails the test.
  void wire(const std::string& switch_ns, const std::vector<std::string>& hosts, std::vector<std::string>* addrs) {
    const std::string net = unused_subnet();
    ASSERT_FALSE(net.empty()) << "no unused 10.x.y.0/24 found";
    const std::string in_switch = "ip -n " + switch_ns + " ";
    ASSERT_EQ(sh_quiet(in_switch + "link add br0 type bridge && " + in_switch + "link set br0 up"), 0);
    for (size_t i = 0; i < hosts.size(); ++i) {
      ASSERT_TRUE(add(hosts[i])) << "ip netns add " << hosts[i];
      addrs->push_back(net + std::to_string(i + 1));
      const std::string port = "v" + std::to_string(i);
      ASSERT_EQ(sh_quiet(in_switch + "link add " + port + " type veth peer name eth0 netns " + hosts[i]), 0);
      ASSERT_EQ(sh_quiet(in_switch + "link set " + port + " master br0 up"), 0);
      ASSERT_EQ(sh_quiet("ip -n " + hosts[i] + " addr add " + addrs->back() + "/24 dev eth0"), 0);
      ASSERT_EQ(sh_quiet("ip -n " + hosts[i] + " link set eth0 up && ip -n " + hosts[i] + " link set lo up"), 0);
    }
  }

 private:
  std::vector<std::string> created_;
};

}  // namespace hybridflow::testing
