// Runs tests/text/chat_template_oracle.py (transformers / jinja2 in the project venv) on a batch of
// cases and returns its answers. Python is a test dependency only; a missing venv fails the tests
// that need it rather than skipping a check CI must run.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "support/python.h"
#include "support/run_command.h"
#include "support/testdata_dir.h"
#include "support/temp_dir.h"

namespace hybridflow::testing {

struct OracleAnswer {
  bool python_found = false;
  CommandResult run;       // the oracle's exit code and output (for failure messages)
  nlohmann::ordered_json answer;  // {"jinja": [...], "chat": [...]}, see chat_template_oracle.py

  // The assertion-ready reason the answer is unusable, or "" when it is fine.
  std::string problem() const {
    if (!python_found)
      return "no Python at " + python_for_tests() +
             ": run scripts/setup.sh (it makes .venv with transformers), or set HF_PYTHON";
    if (run.exit_code != 0) return "tests/text/chat_template_oracle.py failed:\n" + run.output;
    return "";
  }
};

inline OracleAnswer ask_oracle(const nlohmann::ordered_json& request) {
  OracleAnswer a;
  const std::string python = python_for_tests();
  a.python_found = std::filesystem::exists(python);
  if (!a.python_found) return a;
  TempDir dir;
  {
    std::ofstream out(dir.file("request.json"), std::ios::binary);
    out << request.dump();
  }
  a.run = run_shell("HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 " + shell_quote(python) + " " +
                    shell_quote(HF_SOURCE_DIR "/tests/text/chat_template_oracle.py") + " " +
                    shell_quote(dir.file("request.json")) + " " + shell_quote(dir.file("answer.json")));
  if (a.run.exit_code == 0) {
    std::ifstream in(dir.file("answer.json"), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    a.answer = nlohmann::ordered_json::parse(ss.str());
  }
  return a;
}

}  // namespace hybridflow::testing
