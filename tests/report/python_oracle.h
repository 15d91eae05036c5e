// Runs a Python script of tests/report with the venv's python (override with HF_PYTHON) and returns its
// stdout. Python is a test dependency from the venv scripts/setup.sh makes; a missing venv is a failure,
// not a skip.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "support/python.h"
#include "support/run_command.h"

namespace hybridflow::testing {

// Runs tests/report/<script> with `args` (each quoted); a failure to run is an ADD_FAILURE with the output.
// stderr is kept apart (in a file under `scratch_dir`) so that library warnings do not spoil JSON on stdout.
inline CommandResult run_report_script(const std::string& script, const std::string& args, const std::string& scratch_dir) {
  const std::string python = python_for_tests();
  if (!std::filesystem::exists(python)) {
    ADD_FAILURE() << "no Python at " << python
                  << ": run scripts/setup.sh (it makes .venv with tensorboard), or set HF_PYTHON";
    return {};
  }
  const std::string err = scratch_dir + "/python_stderr.txt";
  const std::string cmd = shell_quote(python) + " " + shell_quote(HF_SOURCE_DIR "/tests/report/" + script) + " " +
                          args + " 2>" + shell_quote(err);
  CommandResult r = capture_command(cmd);
  if (r.exit_code != 0) {
    ADD_FAILURE() << script << " failed (exit " << r.exit_code << "): " << cmd << "\n"
                  << r.output << "\n" << capture_command("cat " + shell_quote(err)).output;
  }
  return r;
}

}  // namespace hybridflow::testing
