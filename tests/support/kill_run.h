// Crashing a `hybridflow train` on purpose: starts the command, waits until a condition on its run directory
// holds, and kills the controller and every worker it forked with SIGKILL (no checkpoint, no cleanup). And
// what such a run trained: the uses of each prompt in its samples.jsonl.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "hybridflow/core/jsonl.h"
#include "support/process_tree.h"

namespace hybridflow::testing {

// Runs `command` (output appended to `log`), waits until `ready()` (or the run ends, or 180 s pass) and
// `delay` more, and kills it. True when the kill landed before the run ended.
inline bool kill_run_when(const std::string& command, const std::function<bool()>& ready,
                          std::chrono::milliseconds delay, const std::string& log) {
  const pid_t pid = ::fork();
  if (pid < 0) return false;
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", ("exec " + command + " >> " + log + " 2>&1").c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  while (!ready() && alive(pid) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(delay);
  const std::vector<pid_t> workers = live_children(pid);
  ::kill(pid, SIGKILL);
  for (pid_t w : workers) ::kill(w, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  // The workers are the controller's children, reaped by init: wait until they are gone (they hold nothing
  // the next run needs, but a test should not leave them behind).
  for (pid_t w : workers)
    while (alive(w) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

// How often each prompt was trained, from a run's samples.jsonl (every sample logged:
// trainer.log_samples_freq=1 and a log_samples_count of at least a step's samples).
inline std::map<std::string, int> prompt_uses(const std::string& run_dir) {
  std::map<std::string, int> uses;
  for (const auto& sample : read_jsonl(run_dir + "/samples.jsonl")) ++uses[sample.at("prompt").get<std::string>()];
  return uses;
}

}  // namespace hybridflow::testing
