// The sandboxed python tool: what the model's code can do, and escapes it must not manage.
#include "hybridflow/agent/python_tool.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "hybridflow/agent/tool_config.h"
#include "hybridflow/core/fs.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

namespace hybridflow::agent {
namespace {

using hybridflow::testing::error_of;
using hybridflow::testing::TempDir;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

PythonSandboxLimits test_limits() {
  PythonSandboxLimits limits;
  limits.timeout_s = 5;
  limits.cpu_time_s = 2;
  limits.memory_mb = 512;
  limits.max_processes = 16;
  limits.max_output_bytes = 64 << 10;
  return limits;
}

ToolResult run_code(const std::string& code, PythonSandboxLimits limits = test_limits()) {
  PythonTool tool(nullptr, limits, "code", "test");
  return tool.call(Json{{"code", code}}, nullptr);
}

// Processes still running the sandbox's runner (its command line is unique to it).
int sandbox_processes_alive() {
  int alive = 0;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return 0;
  while (dirent* e = ::readdir(proc)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmdline.find("_limit(resource.RLIMIT_NPROC") != std::string::npos) ++alive;
  }
  ::closedir(proc);
  return alive;
}

bool wait_for_no_sandbox_processes(double seconds) {
  auto start = Clock::now();
  while (seconds_since(start) < seconds) {
    if (sandbox_processes_alive() == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

TEST(PythonTool, RunsCodeAndReturnsItsOutput) {
  ToolResult r = run_code("import math\nprint(sum(range(101)), math.factorial(20))\n");
  ASSERT_TRUE(r.ok()) << r.text;
  EXPECT_EQ(r.text, "5050 2432902008176640000\n");
  ToolResult both = run_code("import sys\nprint('out')\nsys.stderr.write('err\\n')\n");
  ASSERT_TRUE(both.ok()) << both.text;
  EXPECT_EQ(both.text, "out\nerr\n");
  // Writing to the private /tmp works and is gone with the call.
  ToolResult tmp = run_code("open('/tmp/x', 'w').write('hi')\nprint(open('/tmp/x').read())\n");
  EXPECT_EQ(tmp.text, "hi\n");
  EXPECT_EQ(run_code("import os\nprint(os.path.exists('/tmp/x'))\n").text, "False\n");
}

TEST(PythonTool, AnExceptionIsAnErrorResultWithTheTraceback) {
  ToolResult r = run_code("def f():\n    return 1 / 0\nf()\n");
  EXPECT_EQ(r.status, ToolStatus::failed);
  EXPECT_NE(r.text.find("exited with status 1"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("ZeroDivisionError"), std::string::npos) << r.text;
  ToolResult missing = PythonTool(nullptr, test_limits(), "code", "t").call(Json{{"source", "1"}}, nullptr);
  EXPECT_EQ(missing.status, ToolStatus::invalid_arguments);
}

TEST(PythonTool, HostFilesOutsideTheSandboxCannotBeRead) {
  TempDir dir;
  std::string secret = dir.file("secret.txt");
  write_file_atomic(secret, "TOP-SECRET-4711");
  ToolResult r = run_code("print(open('" + secret + "').read())\n");
  EXPECT_EQ(r.status, ToolStatus::failed);
  EXPECT_NE(r.text.find("FileNotFoundError"), std::string::npos) << r.text;
  EXPECT_EQ(r.text.find("TOP-SECRET-4711"), std::string::npos) << r.text;
  // Nothing of the host's /etc, /root, /home or /work is there; the system files are read-only.
  ToolResult listing = run_code(
      "import os\nprint([p for p in ('/etc/passwd', '/root', '/home', '/work', '" + dir.path() + "') if os.path.exists(p)])\n"
      "try:\n    open('/usr/evil', 'w')\nexcept OSError as e:\n    print(type(e).__name__)\n");
  ASSERT_TRUE(listing.ok()) << listing.text;
  EXPECT_EQ(listing.text, "[]\nOSError\n");
}

TEST(PythonTool, NoNetworkEvenToAListenerOnTheHost) {
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  ASSERT_EQ(::listen(listener, 4), 0);
  int port = ntohs(addr.sin_port);
  ToolResult r = run_code("import socket\ntry:\n    socket.create_connection(('127.0.0.1', " + std::to_string(port) +
                          "), timeout=2)\n    print('connected')\nexcept OSError as e:\n    print('refused', type(e).__name__)\n"
                          "try:\n    socket.getaddrinfo('example.com', 80)\n    print('resolved')\nexcept OSError as e:\n"
                          "    print('no dns')\n");
  ASSERT_TRUE(r.ok()) << r.text;
  EXPECT_EQ(r.text.find("connected"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("refused"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("no dns"), std::string::npos) << r.text;
  pollfd p{listener, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 100), 0) << "the listener on the host saw a connection from the sandbox";
  ::close(listener);
}

TEST(PythonTool, TheProcessLimitHoldsAndAForkBombDiesWithTheCall) {
  // Children that sleep: the limit stops the forks long before 200.
  ToolResult counted = run_code(
      "import os, time\nn = 0\ntry:\n    for i in range(200):\n        if os.fork() == 0:\n            time.sleep(3)\n"
      "            os._exit(0)\n        n += 1\nexcept OSError:\n    pass\nprint('forked', n)\n");
  ASSERT_TRUE(counted.ok()) << counted.text;
  int forked = std::atoi(counted.text.substr(counted.text.find(' ') + 1).c_str());
  EXPECT_GT(forked, 0) << counted.text;
  EXPECT_LT(forked, 16) << counted.text;
  ASSERT_TRUE(wait_for_no_sandbox_processes(5)) << "the sleeping children outlived the call";

  auto start = Clock::now();
  ToolResult bomb = run_code("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n");
  EXPECT_FALSE(bomb.ok()) << bomb.text;
  EXPECT_LT(seconds_since(start), 15.0);
  EXPECT_TRUE(wait_for_no_sandbox_processes(5)) << sandbox_processes_alive() << " fork bomb processes survived";
  // And this process is fine: it still starts processes and sandboxes.
  EXPECT_EQ(run_code("print(6 * 7)\n").text, "42\n");
}

TEST(PythonTool, EndlessOutputIsCutAtTheByteLimit) {
  auto start = Clock::now();
  ToolResult r = run_code("while True:\n    print('y' * 1000)\n");
  EXPECT_EQ(r.status, ToolStatus::output_limit);
  EXPECT_NE(r.text.find("more than 65536 bytes to stdout"), std::string::npos) << r.text.substr(0, 200);
  EXPECT_LT(r.text.size(), 2000u);
  EXPECT_LT(seconds_since(start), 5.0);
  EXPECT_TRUE(wait_for_no_sandbox_processes(5));
}

TEST(PythonTool, SleepingPastTheWallClockLimitIsKilled) {
  PythonSandboxLimits limits = test_limits();
  limits.timeout_s = 1.5;
  auto start = Clock::now();
  ToolResult r = run_code("import time\nprint('started', flush=True)\ntime.sleep(60)\n", limits);
  double took = seconds_since(start);
  EXPECT_EQ(r.status, ToolStatus::timed_out);
  EXPECT_NE(r.text.find("ran longer than 1.5"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("started"), std::string::npos) << r.text;
  EXPECT_GE(took, 1.4);
  EXPECT_LT(took, 5.0);
  EXPECT_TRUE(wait_for_no_sandbox_processes(5));
}

TEST(PythonTool, CpuAndMemoryLimits) {
  PythonSandboxLimits limits = test_limits();
  limits.cpu_time_s = 1;
  limits.timeout_s = 20;
  auto start = Clock::now();
  ToolResult spin = run_code("while True:\n    pass\n", limits);
  EXPECT_EQ(spin.status, ToolStatus::failed) << spin.text;
  EXPECT_NE(spin.text.find("CPU time"), std::string::npos) << spin.text;
  EXPECT_LT(seconds_since(start), 10.0);
  ToolResult hog = run_code("x = bytearray(2 << 30)\nprint(len(x))\n");
  EXPECT_EQ(hog.status, ToolStatus::failed);
  EXPECT_NE(hog.text.find("MemoryError"), std::string::npos) << hog.text;
}

TEST(PythonTool, ConfigKeysAndMissingBwrap) {
  ToolSet tools = load_tool_config_from_string(
      "tools:\n  - config: {type: python, timeout_s: 4, cpu_time_s: 2, memory_mb: 256, max_processes: 8}\n",
      "py.yaml", "");
  ASSERT_EQ(tools.names(), (std::vector<std::string>{"python"}));
  EXPECT_EQ(tools.find("python")->call(Json{{"code", "print('ok')"}}, nullptr).text, "ok\n");
  std::string low = error_of([] {
    load_tool_config_from_string("tools:\n  - config: {type: python, memory_mb: 8}\n", "py.yaml", "");
  });
  EXPECT_NE(low.find("py.yaml: tools[0]"), std::string::npos) << low;
  EXPECT_NE(low.find("config.memory_mb: expected >= 64"), std::string::npos) << low;

  TempDir empty;
  std::string saved = std::getenv("PATH") != nullptr ? std::getenv("PATH") : "";
  ::setenv("PATH", empty.path().c_str(), 1);
  std::string msg = error_of([] {
    load_tool_config_from_string("tools:\n  - config: {type: python}\n", "py.yaml", "");
  });
  ::setenv("PATH", saved.c_str(), 1);
  EXPECT_NE(msg.find("py.yaml: tools[0]: the python tool runs code under bubblewrap, but 'bwrap' is not on PATH"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("apt-get install bubblewrap"), std::string::npos) << msg;
}

}  // namespace
}  // namespace hybridflow::agent
