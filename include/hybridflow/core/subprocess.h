// Runs programs bounded in time and in bytes, so that a runaway program (`cat /dev/zero`, `sleep 1e9`)
// cannot take the trainer's memory or stall it. fork/exec with pipes: no shell, no temporary files.
// run_subprocess is one call (stdin bytes in, stdout/stderr out: reward commands, command tools);
// PipedProcess is a long-lived child spoken to line by line (MCP servers over stdio).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace hybridflow {

struct SubprocessOptions {
  // Added to (or replacing in) the inherited environment, e.g. {"HF_TOOL_KWARGS", "{...}"}.
  std::vector<std::pair<std::string, std::string>> extra_env;
  // When the trainer runs as root, run the program as nobody (uid/gid 65534, no supplementary groups):
  // the kernel exempts root from RLIMIT_NPROC, so a sandbox that limits processes must not run as root.
  bool drop_root = false;
  // Where it runs ("" = the caller's working directory).
  std::string working_dir;
};

struct SubprocessResult {
  int exit_code = -1;    // valid when !signaled && !timed_out
  bool signaled = false;  // killed by a signal it did not catch (term_signal says which)
  int term_signal = 0;
  bool timed_out = false;  // we killed it (its whole process group) after timeout_s
  // It wrote more than max_output_bytes to stdout or stderr (which one: output_exceeded_stream); we
  // stopped reading and killed its process group. `out` / `err` hold what was read up to then.
  bool output_exceeded = false;
  const char* output_exceeded_stream = "";
  std::string out;
  std::string err;
};

// "command 'prog arg'" for messages; a {"/bin/sh", "-c", line} argv shows as "command 'line'".
std::string describe_command(const std::vector<std::string>& argv);

// Throws hybridflow::Error when the program cannot be started (not found, not executable),
// naming argv[0]. The child runs in its own process group: a timeout or too much output kills the whole
// group, and once the program exits, whatever it left running in its group (a background `cmd &`) is
// killed too, so nothing outlives the call.
SubprocessResult run_subprocess(const std::vector<std::string>& argv, const std::string& input, double timeout_s,
                                size_t max_output_bytes = 16u << 20, const SubprocessOptions& options = {});

// A child process with pipes to its stdin and stdout, in its own process group; its stderr is drained
// whenever we wait on it and its last bytes kept for error messages. Not thread-safe: one user at a time.
// The destructor kills the group and reaps the child.
class PipedProcess {
 public:
  using Clock = std::chrono::steady_clock;
  // Throws hybridflow::Error when the program cannot be started, naming argv[0].
  explicit PipedProcess(const std::vector<std::string>& argv, const SubprocessOptions& options = {});
  ~PipedProcess();
  PipedProcess(const PipedProcess&) = delete;
  PipedProcess& operator=(const PipedProcess&) = delete;

  enum class Io { ok, closed, timed_out, too_long };
  // Writes all of `data` to its stdin by the deadline; `closed` when it stopped reading (or exited).
  Io write_all(const std::string& data, Clock::time_point deadline);
  // One line of its stdout, without the '\n'. `closed` at end of output, `too_long` when a line passes
  // max_line_bytes (the rest of the stream is then unusable: kill it).
  Io read_line(std::string& line, Clock::time_point deadline, size_t max_line_bytes);
  // Reads its stderr until it closes or the deadline passes (after it exited, to report why).
  void drain_stderr(Clock::time_point deadline);
  // The last few KiB it wrote to stderr.
  const std::string& stderr_tail() const { return err_tail_; }
  // "exited with status 3" / "killed by signal 9 (Killed)" once it has ended, else "" (does not block).
  std::string exit_description();
  // SIGKILL to its process group; the destructor reaps it.
  void kill();

 private:
  // Reads whatever stdout/stderr have, waiting at most until the deadline for something to happen.
  // Returns false when the deadline passed without any event.
  bool pump(Clock::time_point deadline, bool want_write);

  pid_t pid_ = -1;
  int in_ = -1, out_ = -1, err_ = -1;
  bool reaped_ = false;
  int status_ = 0;
  std::string out_buffer_;
  std::string err_tail_;
  std::string argv0_;
};

}  // namespace hybridflow
