#include "hybridflow/core/subprocess.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <tuple>

#include "hybridflow/core/error.h"

namespace hybridflow {
namespace subprocess_detail {

struct Pipe {
  int read = -1;
  int write = -1;
};

Pipe make_pipe() {
  int fds[2];
  HF_CHECK(::pipe2(fds, O_CLOEXEC) == 0, "pipe2 failed: ", std::strerror(errno));
  return {fds[0], fds[1]};
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Writing to a pipe whose reader has exited raises SIGPIPE, which would kill the whole trainer.
// Block it in this thread while we talk to the child and drop any instance we caused.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_set_);
    sigaddset(&pipe_set_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_set_, &old_mask_);
  }
  ~SigpipeGuard() {
    if (!was_pending_) {
      struct timespec zero = {0, 0};
      while (sigtimedwait(&pipe_set_, nullptr, &zero) == SIGPIPE) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  }

 private:
  sigset_t pipe_set_;
  sigset_t old_mask_;
  bool was_pending_ = false;
};

// Everything the child needs, prepared before fork: between fork and exec only async-signal-safe calls.
struct ExecPlan {
  std::vector<std::string> argv;
  std::vector<std::string> env_storage;
  std::vector<char*> args;
  std::vector<char*> env;
  bool drop_root = false;
  std::string working_dir;
};

ExecPlan make_exec_plan(const std::vector<std::string>& argv, const SubprocessOptions& options) {
  ExecPlan plan;
  plan.argv = argv;
  plan.drop_root = options.drop_root && ::geteuid() == 0;
  plan.working_dir = options.working_dir;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string entry = *e;
    std::string key = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& [k, v] : options.extra_env) replaced = replaced || k == key;
    if (!replaced) plan.env_storage.push_back(entry);
  }
  for (const auto& [k, v] : options.extra_env) plan.env_storage.push_back(k + "=" + v);
  for (auto& a : plan.argv) plan.args.push_back(a.data());
  plan.args.push_back(nullptr);
  for (auto& e : plan.env_storage) plan.env.push_back(e.data());
  plan.env.push_back(nullptr);
  return plan;
}

[[noreturn]] void exec_child(const ExecPlan& plan, int in_read, int out_write, int err_write, int exec_error_write) {
  ::setpgid(0, 0);
  // dup2 clears FD_CLOEXEC on the copies, so only 0/1/2 survive exec.
  ::dup2(in_read, 0);
  ::dup2(out_write, 1);
  ::dup2(err_write, 2);
  int code = 0;
  if (!plan.working_dir.empty() && ::chdir(plan.working_dir.c_str()) != 0) code = errno;
  if (code == 0 && plan.drop_root) {
    constexpr uid_t kNobody = 65534;
    if (::setgroups(0, nullptr) != 0 || ::setresgid(kNobody, kNobody, kNobody) != 0 ||
        ::setresuid(kNobody, kNobody, kNobody) != 0)
      code = errno;
  }
  if (code == 0) {
    ::execvpe(plan.args[0], plan.args.data(), const_cast<char* const*>(plan.env.data()));
    code = errno;
  }
  ssize_t ignored = ::write(exec_error_write, &code, sizeof code);
  (void)ignored;
  ::_exit(127);
}

struct Spawned {
  pid_t pid = -1;
  int in_write = -1;
  int out_read = -1;
  int err_read = -1;
};

// Starts argv in its own process group with three pipes; throws when it cannot be started.
Spawned spawn_child(const std::vector<std::string>& argv, const SubprocessOptions& options) {
  HF_CHECK(!argv.empty() && !argv[0].empty(), "run_subprocess: empty command");
  ExecPlan plan = make_exec_plan(argv, options);
  Pipe in = make_pipe(), out = make_pipe(), err = make_pipe(), exec_error = make_pipe();
  pid_t pid = ::fork();
  if (pid < 0) {
    for (int* fd : {&in.read, &in.write, &out.read, &out.write, &err.read, &err.write, &exec_error.read,
                    &exec_error.write})
      close_fd(*fd);
    HF_FAIL("cannot fork to run '", argv[0], "': ", std::strerror(errno));
  }
  if (pid == 0) exec_child(plan, in.read, out.write, err.write, exec_error.write);
  // Also from this side, so that the group exists before any kill(-pid) below (whichever runs first wins;
  // the other's EACCES/ESRCH is harmless).
  ::setpgid(pid, pid);
  close_fd(in.read);
  close_fd(out.write);
  close_fd(err.write);
  close_fd(exec_error.write);

  int exec_errno = 0;
  ssize_t got = ::read(exec_error.read, &exec_errno, sizeof exec_errno);  // EOF at exec: success
  close_fd(exec_error.read);
  if (got == static_cast<ssize_t>(sizeof exec_errno)) {
    close_fd(in.write);
    close_fd(out.read);
    close_fd(err.read);
    ::waitpid(pid, nullptr, 0);
    HF_FAIL("cannot run '", argv[0], "': ", std::strerror(exec_errno));
  }
  ::fcntl(in.write, F_SETFL, O_NONBLOCK);
  return {pid, in.write, out.read, err.read};
}

}  // namespace subprocess_detail

using namespace subprocess_detail;

std::string describe_command(const std::vector<std::string>& argv) {
  bool via_shell = argv.size() == 3 && argv[0] == "/bin/sh" && argv[1] == "-c";
  if (via_shell) return "command '" + argv[2] + "'";
  // A program given inline (python3 -c "...") shows as its first line: errors and log lines stay one line long.
  std::string joined;
  for (const auto& a : argv) {
    const size_t newline = a.find('\n');
    const std::string shown =
        newline == std::string::npos
            ? a
            : a.substr(0, newline) + " ... (" + std::to_string(std::count(a.begin(), a.end(), '\n') + 1) + " lines)";
    joined += (joined.empty() ? "" : " ") + shown;
  }
  return "command '" + joined + "'";
}

SubprocessResult run_subprocess(const std::vector<std::string>& argv, const std::string& input, double timeout_s,
                                size_t max_output_bytes, const SubprocessOptions& options) {
  SigpipeGuard sigpipe_guard;
  Spawned child = spawn_child(argv, options);
  pid_t pid = child.pid;
  Pipe in{-1, child.in_write}, out{child.out_read, -1}, err{child.err_read, -1};
  SubprocessResult result;
  size_t written = 0;
  if (input.empty()) close_fd(in.write);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  char buffer[65536];
  while (out.read >= 0 || err.read >= 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      break;
    }
    pollfd fds[3];
    int n = 0;
    int out_slot = -1, err_slot = -1, in_slot = -1;
    if (out.read >= 0) fds[out_slot = n++] = {out.read, POLLIN, 0};
    if (err.read >= 0) fds[err_slot = n++] = {err.read, POLLIN, 0};
    if (in.write >= 0) fds[in_slot = n++] = {in.write, POLLOUT, 0};
    int ready = ::poll(fds, n, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (ready < 0 && errno == EINTR) continue;
    HF_CHECK(ready >= 0, "poll failed while running '", argv[0], "': ", std::strerror(errno));
    if (in_slot >= 0 && fds[in_slot].revents) {
      ssize_t w = ::write(in.write, input.data() + written, input.size() - written);
      if (w > 0) written += static_cast<size_t>(w);
      // EPIPE: the program stopped reading; its output will say what went wrong.
      if (written == input.size() || (w < 0 && errno != EAGAIN && errno != EINTR)) close_fd(in.write);
    }
    for (auto [slot, fd, sink] : {std::make_tuple(out_slot, &out.read, &result.out),
                                  std::make_tuple(err_slot, &err.read, &result.err)}) {
      if (slot < 0 || !fds[slot].revents) continue;
      ssize_t r = ::read(*fd, buffer, sizeof buffer);
      if (r > 0) {
        sink->append(buffer, static_cast<size_t>(r));
        if (sink->size() > max_output_bytes) {
          result.output_exceeded = true;
          result.output_exceeded_stream = sink == &result.out ? "stdout" : "stderr";
        }
      } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
        close_fd(*fd);
      }
    }
    if (result.output_exceeded) break;
  }
  close_fd(in.write);
  close_fd(out.read);
  close_fd(err.read);
  auto kill_group = [pid] {
    ::kill(-pid, SIGKILL);
    ::kill(pid, SIGKILL);
  };
  if (result.timed_out || result.output_exceeded) kill_group();
  // Output closed: the child is exiting; still bound the wait in case it closed its pipes and hung.
  // WNOWAIT leaves it a zombie, so its pid (the group's id) cannot be reused while we kill the group.
  while (true) {
    siginfo_t info{};
    int rc = ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT);
    if (rc == 0 && info.si_pid == pid) break;
    if (rc < 0 && errno != EINTR) break;
    if (std::chrono::steady_clock::now() > deadline && !result.timed_out && !result.output_exceeded) {
      result.timed_out = true;
      kill_group();
    }
    ::usleep(2000);
  }
  // Whatever the program left running in its group (`sleep 100 &` with its output redirected) dies with it.
  ::kill(-pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (result.timed_out || result.output_exceeded) return result;
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.signaled = true;
    result.term_signal = WTERMSIG(status);
  }
  return result;
}

namespace subprocess_detail {

constexpr size_t kStderrTailBytes = 4096;

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  return "ended with wait status " + std::to_string(status);
}

}  // namespace subprocess_detail

PipedProcess::PipedProcess(const std::vector<std::string>& argv, const SubprocessOptions& options)
    : argv0_(argv.empty() ? "" : argv[0]) {
  Spawned child = spawn_child(argv, options);
  pid_ = child.pid;
  in_ = child.in_write;
  out_ = child.out_read;
  err_ = child.err_read;
}

PipedProcess::~PipedProcess() {
  close_fd(in_);
  close_fd(out_);
  close_fd(err_);
  if (pid_ > 0 && !reaped_) {
    kill();
    while (::waitpid(pid_, &status_, 0) < 0 && errno == EINTR) {
    }
  } else if (pid_ > 0) {
    ::kill(-pid_, SIGKILL);  // whatever it left in its group
  }
}

void PipedProcess::kill() {
  if (pid_ <= 0) return;
  ::kill(-pid_, SIGKILL);
  if (!reaped_) ::kill(pid_, SIGKILL);
}

std::string PipedProcess::exit_description() {
  if (!reaped_) {
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r != pid_) return "";
    reaped_ = true;
    status_ = status;
    ::kill(-pid_, SIGKILL);
  }
  return describe_wait_status(status_);
}

bool PipedProcess::pump(Clock::time_point deadline, bool want_write) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return false;
  pollfd fds[3];
  int n = 0, out_slot = -1, err_slot = -1, in_slot = -1;
  if (out_ >= 0) fds[out_slot = n++] = {out_, POLLIN, 0};
  if (err_ >= 0) fds[err_slot = n++] = {err_, POLLIN, 0};
  if (want_write && in_ >= 0) fds[in_slot = n++] = {in_, POLLOUT, 0};
  if (n == 0) return false;
  int ready = ::poll(fds, n, static_cast<int>(std::min<int64_t>(left, 1000)));
  if (ready < 0 && errno == EINTR) return true;
  HF_CHECK(ready >= 0, "poll failed while talking to '", argv0_, "': ", std::strerror(errno));
  if (ready == 0) return Clock::now() < deadline;
  char buffer[65536];
  if (out_slot >= 0 && fds[out_slot].revents) {
    ssize_t r = ::read(out_, buffer, sizeof buffer);
    if (r > 0) out_buffer_.append(buffer, static_cast<size_t>(r));
    else if (r == 0 || (errno != EAGAIN && errno != EINTR)) close_fd(out_);
  }
  if (err_slot >= 0 && fds[err_slot].revents) {
    ssize_t r = ::read(err_, buffer, sizeof buffer);
    if (r > 0) {
      err_tail_.append(buffer, static_cast<size_t>(r));
      if (err_tail_.size() > kStderrTailBytes) err_tail_.erase(0, err_tail_.size() - kStderrTailBytes);
    } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
      close_fd(err_);
    }
  }
  return true;
}

void PipedProcess::drain_stderr(Clock::time_point deadline) {
  while (err_ >= 0 && pump(deadline, /*want_write=*/false)) {
  }
}

PipedProcess::Io PipedProcess::write_all(const std::string& data, Clock::time_point deadline) {
  SigpipeGuard sigpipe_guard;
  size_t written = 0;
  while (written < data.size()) {
    if (in_ < 0) return Io::closed;
    ssize_t w = ::write(in_, data.data() + written, data.size() - written);
    if (w > 0) {
      written += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno != EAGAIN && errno != EINTR) {
      close_fd(in_);  // EPIPE: it stopped reading
      return Io::closed;
    }
    // Its stdin is full: keep draining its output meanwhile, so neither side blocks on the other.
    if (!pump(deadline, /*want_write=*/true)) return Io::timed_out;
  }
  return Io::ok;
}

PipedProcess::Io PipedProcess::read_line(std::string& line, Clock::time_point deadline, size_t max_line_bytes) {
  while (true) {
    size_t eol = out_buffer_.find('\n');
    if (eol != std::string::npos) {
      if (eol > max_line_bytes) return Io::too_long;
      line = out_buffer_.substr(0, eol);
      out_buffer_.erase(0, eol + 1);
      return Io::ok;
    }
    if (out_buffer_.size() > max_line_bytes) return Io::too_long;
    if (out_ < 0) return Io::closed;
    if (!pump(deadline, /*want_write=*/false)) return Io::timed_out;
  }
}

}  // namespace hybridflow
