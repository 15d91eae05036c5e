// Runs a program with given stdin bytes and collects its stdout/stderr, with a wall-clock limit.
// fork/exec with pipes: no shell, no temporary files. Used by CommandReward.
#pragma once

#include <string>
#include <vector>

namespace hybridflow {

struct SubprocessResult {
  int exit_code = -1;    // valid when !signaled && !timed_out
  bool signaled = false;  // killed by a signal it did not catch (term_signal says which)
  int term_signal = 0;
  bool timed_out = false;  // we killed it (its whole process group) after timeout_s
  std::string out;
  std::string err;
};

// Throws hybridflow::Error when the program cannot be started (not found, not executable),
// naming argv[0]. The child runs in its own process group so a timeout also kills its children.
SubprocessResult run_subprocess(const std::vector<std::string>& argv, const std::string& input, double timeout_s);

}  // namespace hybridflow
