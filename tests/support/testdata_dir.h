// Where the published tokenizer files (shared/testdata) the tests and bench_tokenizer read are kept.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace hybridflow::testing {

// Where the published tokenizers the tests use are: <dir>/<name>/tokenizer.json (+ tokenizer_config.json).
// HF_TESTDATA_DIR overrides; otherwise the first of the places a checkout or a worktree keeps
// shared/testdata that exists.
inline std::vector<std::string> tokenizer_data_candidates() {
  const char* env = std::getenv("HF_TESTDATA_DIR");
  if (env != nullptr && *env != '\0') return {std::string(env) + "/tokenizers"};
  return {HF_SOURCE_DIR "/../shared/testdata/tokenizers", HF_SOURCE_DIR "/shared/testdata/tokenizers",
          HF_SOURCE_DIR "/../../shared/testdata/tokenizers"};
}

inline std::string tokenizer_data_dir() {
  for (const std::string& dir : tokenizer_data_candidates())
    if (std::filesystem::is_directory(dir)) return dir;
  return tokenizer_data_candidates().front();
}

// For a skip message: every place looked at.
inline std::string tokenizer_data_searched() {
  std::string out;
  for (const std::string& dir : tokenizer_data_candidates()) out += (out.empty() ? "" : ", ") + dir;
  return out;
}

}  // namespace hybridflow::testing
