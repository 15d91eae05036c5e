// A built-in code-execution tool: runs the model's Python under bubblewrap (`bwrap`), one sandbox per
// call. Inside: no network (own empty network namespace), the system's /usr read-only and nothing else of
// the host's files, a private empty /tmp, own pid namespace (everything dies with the call), and the
// resource limits below, set before the model's code starts. When the trainer runs as root the sandbox
// runs as nobody, since the kernel exempts root from the process limit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hybridflow/agent/tool.h"

namespace hybridflow::agent {

struct PythonSandboxLimits {
  double timeout_s = 10;                  // wall clock, then the sandbox is killed
  int64_t cpu_time_s = 5;                 // RLIMIT_CPU of each process
  int64_t memory_mb = 1024;               // RLIMIT_AS of each process
  int64_t max_processes = 32;             // RLIMIT_NPROC in the sandbox's user namespace
  int64_t max_file_mb = 16;               // RLIMIT_FSIZE: the largest file it may write
  int64_t max_output_bytes = 64 << 10;    // stdout and stderr, each
  std::string python = "/usr/bin/python3";  // must live under a read-only path of the sandbox
  std::vector<std::string> ro_paths;      // more host paths bound read-only (e.g. a venv)
};

class PythonTool : public Tool {
 public:
  // `schema` null: the default schema (a `code` string). The code is in the argument `code_argument`.
  // Throws when bwrap is not installed (naming it and how to install it) or the interpreter is missing.
  PythonTool(Json schema, PythonSandboxLimits limits, std::string code_argument, const std::string& where);
  std::string describe() const override;
  static Json default_schema();
  // The bwrap command line for one run (for tests and docs).
  std::vector<std::string> sandbox_argv() const;

 protected:
  ToolResult run(const Json& arguments, const Json& kwargs) const override;

 private:
  PythonSandboxLimits limits_;
  std::string code_argument_;
  std::string bwrap_;
};

// The bwrap on PATH, or an Error naming bwrap and how to install it (`where` names the config entry).
std::string find_bwrap(const std::string& where);

}  // namespace hybridflow::agent
