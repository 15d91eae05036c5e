// Runs a command line as a user would in a shell and returns its exit code with stdout and stderr
// together, so app tests can assert on exactly what the user reads.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace hybridflow::testing {

struct CommandResult {
  int exit_code = -1;  // -1 when the command could not start or was killed by a signal
  std::string output;  // stdout and stderr together
};

inline CommandResult capture_command(const std::string& command_line) {
  CommandResult r;
  FILE* pipe = ::popen(command_line.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// A whole shell script (pipes, `&&`, environment assignments); its stderr is captured too.
inline CommandResult run_shell(const std::string& script) { return capture_command("(" + script + ") 2>&1"); }

#ifdef HF_BINARY
// The `hybridflow` binary under test (HF_BINARY is defined for tests/apps only) with `args`.
inline CommandResult run_hybridflow(const std::string& args) {
  return capture_command(std::string(HF_BINARY) + " " + args + " 2>&1");
}
#endif

}  // namespace hybridflow::testing
