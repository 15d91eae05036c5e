// Runs a program with given stdin bytes and collects its stdout/stderr, bounded in time (one wall-clock
// deadline over the whole run) and in bytes (per stream), so that a runaway program (`cat /dev/zero`)
// cannot take the trainer's memory. fork/exec with pipes: no shell, no temporary files. Used by CommandReward.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace hybridflow {

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

// Throws hybridflow::Error when the program cannot be started (not found, not executable),
// naming argv[0]. The child runs in its own process group: a timeout or too much output kills the whole
// group, and once the program exits, whatever it left running in its group (a background `cmd &`) is
// killed too, so nothing outlives the call.
SubprocessResult run_subprocess(const std::vector<std::string>& argv, const std::string& input, double timeout_s,
                                size_t max_output_bytes = 16u << 20);

}  // namespace hybridflow
