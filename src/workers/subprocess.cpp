#include "hybridflow/workers/subprocess.h"

#include <fcntl.h>
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
namespace {

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

[[noreturn]] void exec_child(const std::vector<std::string>& argv, const Pipe& in, const Pipe& out,
                             const Pipe& err, const Pipe& exec_error) {
  ::setpgid(0, 0);
  // dup2 clears FD_CLOEXEC on the copies, so only 0/1/2 survive exec.
  ::dup2(in.read, 0);
  ::dup2(out.write, 1);
  ::dup2(err.write, 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  int code = errno;
  ssize_t ignored = ::write(exec_error.write, &code, sizeof code);
  (void)ignored;
  ::_exit(127);
}

}  // namespace

SubprocessResult run_subprocess(const std::vector<std::string>& argv, const std::string& input, double timeout_s,
                                size_t max_output_bytes) {
  HF_CHECK(!argv.empty() && !argv[0].empty(), "run_subprocess: empty command");
  SigpipeGuard sigpipe_guard;
  Pipe in = make_pipe(), out = make_pipe(), err = make_pipe(), exec_error = make_pipe();
  pid_t pid = ::fork();
  if (pid < 0) {
    for (int* fd : {&in.read, &in.write, &out.read, &out.write, &err.read, &err.write, &exec_error.read,
                    &exec_error.write})
      close_fd(*fd);
    HF_FAIL("cannot fork to run '", argv[0], "': ", std::strerror(errno));
  }
  if (pid == 0) exec_child(argv, in, out, err, exec_error);
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

}  // namespace hybridflow
