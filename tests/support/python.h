// The Python the tests use as an oracle (transformers, tokenizers, jinja2, tensorboard): the project venv
// that scripts/setup.sh makes, or HF_PYTHON. Python is a test dependency only; a missing venv fails the
// tests that need it rather than skipping a check CI must run.
#pragma once

#include <cstdlib>
#include <string>

namespace hybridflow::testing {

inline std::string python_for_tests() {
  const char* env = std::getenv("HF_PYTHON");
  return env != nullptr && *env != '\0' ? env : HF_SOURCE_DIR "/.venv/bin/python";
}

// One argument for /bin/sh, whatever it contains.
inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace hybridflow::testing
