// Runs tests/text/tokenizers_oracle.py (the Python `tokenizers` library) on a request and returns
// its response, so that a test program compares with the reference in one Python process. Python is
// a test dependency from the venv scripts/setup.sh makes (override with HF_PYTHON); a missing venv
// is a failure, not a skip.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <vector>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "support/python.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/testdata_dir.h"

namespace hybridflow::testing {

// Empty json and a recorded failure when the oracle cannot run.
inline nlohmann::json run_tokenizers_oracle(const nlohmann::json& request) {
  TempDir dir;
  const std::string req = dir.file("request.json"), resp = dir.file("response.json");
  std::ofstream(req) << request.dump();
  const std::string cmd = "RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false " + shell_quote(python_for_tests()) + " " +
                          shell_quote(HF_SOURCE_DIR "/tests/text/tokenizers_oracle.py") + " " + shell_quote(req) +
                          " " + shell_quote(resp);
  const CommandResult r = run_shell(cmd);
  if (r.exit_code != 0) {
    ADD_FAILURE() << "the tokenizers oracle failed (exit " << r.exit_code << "): " << cmd << "\n" << r.output;
    return {};
  }
  std::ifstream in(resp);
  std::stringstream buf;
  buf << in.rdbuf();
  return nlohmann::json::parse(buf.str());
}

}  // namespace hybridflow::testing
