#include "hybridflow/agent/python_tool.h"

#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "hybridflow/core/error.h"
#include "hybridflow/core/subprocess.h"

namespace hybridflow::agent {
namespace python_tool_detail {

bool is_executable_file(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// Runs inside the sandbox before the model's code: limits first (the code cannot raise a hard limit),
// then the code, read from stdin, runs as __main__ with stdin closed.
std::string runner_program(const PythonSandboxLimits& limits) {
  std::ostringstream p;
  p << "import os, resource, sys\n"
    << "def _limit(kind, soft, hard):\n"
    << "    resource.setrlimit(kind, (soft, hard))\n"
    // SIGXCPU at the soft limit (the default action ends the process), SIGKILL a second later.
    << "_limit(resource.RLIMIT_CPU, " << limits.cpu_time_s << ", " << limits.cpu_time_s + 1 << ")\n"
    << "_limit(resource.RLIMIT_AS, " << limits.memory_mb << " << 20, " << limits.memory_mb << " << 20)\n"
    << "_limit(resource.RLIMIT_NPROC, " << limits.max_processes << ", " << limits.max_processes << ")\n"
    << "_limit(resource.RLIMIT_FSIZE, " << limits.max_file_mb << " << 20, " << limits.max_file_mb << " << 20)\n"
    << "_limit(resource.RLIMIT_CORE, 0, 0)\n"
    << "_source = sys.stdin.read()\n"
    << "_null = os.open(os.devnull, os.O_RDONLY)\n"
    << "os.dup2(_null, 0)\n"
    << "sys.stdin = open(0, closefd=False)\n"
    << "del _limit, _null\n"
    << "exec(compile(_source, '<tool code>', 'exec'), {'__name__': '__main__', '__builtins__': __builtins__})\n";
  return p.str();
}

std::string tail_text(const std::string& s, size_t max) { return s.size() <= max ? s : "..." + s.substr(s.size() - max); }

}  // namespace python_tool_detail

using namespace python_tool_detail;

std::string find_bwrap(const std::string& where) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    std::string candidate = (dir.empty() ? "." : dir) + "/bwrap";
    if (is_executable_file(candidate)) return candidate;
  }
  HF_FAIL(where, ": the python tool runs code under bubblewrap, but 'bwrap' is not on PATH; install it "
                 "(Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap; scripts/setup.sh "
                 "installs it)");
}

Json PythonTool::default_schema() {
  return Json::parse(R"({"type": "function", "function": {"name": "python",
    "description": "Run Python 3 code in a sandbox without network access and return what it prints (stdout, then stderr). Only printed output is returned.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "the Python program to run"}},
                   "required": ["code"]}}})");
}

PythonTool::PythonTool(Json schema, PythonSandboxLimits limits, std::string code_argument, const std::string& where)
    : Tool(schema.is_null() ? default_schema() : std::move(schema), where),
      limits_(std::move(limits)),
      code_argument_(std::move(code_argument)) {
  HF_CHECK(limits_.timeout_s > 0, where, ": config.timeout_s: expected > 0, got ", limits_.timeout_s);
  HF_CHECK(limits_.cpu_time_s > 0, where, ": config.cpu_time_s: expected > 0, got ", limits_.cpu_time_s);
  HF_CHECK(limits_.memory_mb >= 64, where, ": config.memory_mb: expected >= 64 (Python needs that much), got ",
           limits_.memory_mb);
  HF_CHECK(limits_.max_processes >= 1, where, ": config.max_processes: expected >= 1, got ", limits_.max_processes);
  HF_CHECK(limits_.max_file_mb >= 0, where, ": config.max_file_mb: expected >= 0, got ", limits_.max_file_mb);
  HF_CHECK(limits_.max_output_bytes > 0, where, ": config.max_output_bytes: expected > 0, got ",
           limits_.max_output_bytes);
  HF_CHECK(!limits_.python.empty() && limits_.python[0] == '/', where,
           ": config.python: expected an absolute path, got '", limits_.python, "'");
  HF_CHECK(is_executable_file(limits_.python), where, ": config.python: '", limits_.python,
           "' is not an executable file");
  for (const auto& path : limits_.ro_paths)
    HF_CHECK(!path.empty() && path[0] == '/' && std::filesystem::exists(path), where, ": config.ro_paths: '", path,
             "' is not an absolute path that exists");
  const Json& properties = this->schema()["function"].value("parameters", Json::object()).value("properties", Json::object());
  HF_CHECK(properties.contains(code_argument_), where, ": tool_schema: the code argument '", code_argument_,
           "' (config.code_argument) is not among the function's parameters");
  bwrap_ = find_bwrap(where);
}

std::string PythonTool::describe() const { return "python sandbox (" + limits_.python + " under bwrap)"; }

std::vector<std::string> PythonTool::sandbox_argv() const {
  std::vector<std::string> argv = {bwrap_,
                                   "--unshare-all",    // network, pid, ipc, uts, cgroup namespaces
                                   "--unshare-user",   // and a user namespace even when started as root
                                   "--die-with-parent",
                                   "--new-session",    // no terminal to inject keystrokes into
                                   "--ro-bind", "/usr", "/usr"};
  // Merged-/usr systems have /bin, /lib... as links into /usr; older ones as directories.
  for (const char* top : {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}) {
    std::error_code ec;
    auto status = std::filesystem::symlink_status(top, ec);
    if (ec || !std::filesystem::exists(status)) continue;
    if (std::filesystem::is_symlink(status)) {
      argv.insert(argv.end(), {"--symlink", std::filesystem::read_symlink(top, ec).string(), top});
    } else if (std::filesystem::is_directory(status)) {
      argv.insert(argv.end(), {"--ro-bind", top, top});
    }
  }
  for (const auto& path : limits_.ro_paths) argv.insert(argv.end(), {"--ro-bind", path, path});
  argv.insert(argv.end(), {"--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--chdir", "/tmp",
                           "--hostname", "sandbox", "--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
                           "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8", "--setenv",
                           "PYTHONDONTWRITEBYTECODE", "1", "--", limits_.python, "-I", "-c", runner_program(limits_)});
  return argv;
}

ToolResult PythonTool::run(const Json& arguments, const Json& /*kwargs*/) const {
  const Json& code = arguments[code_argument_];
  if (!code.is_string())
    return ToolResult::error(ToolStatus::invalid_arguments, "argument '" + code_argument_ + "' must be a string of code");
  SubprocessOptions options;
  options.drop_root = true;
  SubprocessResult run = run_subprocess(sandbox_argv(), code.get<std::string>(), limits_.timeout_s,
                                        static_cast<size_t>(limits_.max_output_bytes), options);
  std::string output = run.out;
  if (!run.err.empty()) output += (output.empty() || output.back() == '\n' ? "" : "\n") + run.err;
  if (run.output_exceeded)
    return ToolResult::error(ToolStatus::output_limit,
                             "the code wrote more than " + std::to_string(limits_.max_output_bytes) + " bytes to " +
                                 run.output_exceeded_stream + " and was stopped; the end of its output:\n" +
                                 tail_text(output, 400));
  if (run.timed_out)
    return ToolResult::error(ToolStatus::timed_out, "the code ran longer than " + std::to_string(limits_.timeout_s) +
                                                        " s and was stopped" +
                                                        (output.empty() ? "" : "; its output so far:\n" + tail_text(output, 2000)));
  // The sandbox's init (bwrap, pid 1 of its namespace) reports a child killed by signal N as status 128 + N.
  if (!run.signaled && run.exit_code > 128 && run.exit_code <= 128 + 64) {
    run.signaled = true;
    run.term_signal = run.exit_code - 128;
  }
  if (run.signaled) {
    std::string why = run.term_signal == SIGXCPU   ? " (CPU time limit " + std::to_string(limits_.cpu_time_s) + " s)"
                      : run.term_signal == SIGKILL ? " (a CPU time or memory limit)"
                                                   : "";
    return ToolResult::error(ToolStatus::failed, "the code was killed by signal " + std::to_string(run.term_signal) +
                                                     " (" + strsignal(run.term_signal) + ")" + why +
                                                     (output.empty() ? "" : "\n" + tail_text(output, 2000)));
  }
  if (run.exit_code != 0) {
    // bwrap itself failing (no user namespaces) exits 1 with its own message: say so rather than blame the code.
    if (run.out.empty() && run.err.rfind("bwrap:", 0) == 0)
      return ToolResult::error(ToolStatus::failed, "the sandbox could not start: " + tail_text(run.err, 500));
    return ToolResult::error(ToolStatus::failed, "the code exited with status " + std::to_string(run.exit_code) +
                                                     (output.empty() ? "" : "\n" + tail_text(output, 2000)));
  }
  ToolResult result;
  result.text = output;
  return result;
}

}  // namespace hybridflow::agent
