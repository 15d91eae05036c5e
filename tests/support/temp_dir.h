// A scratch directory for one test, removed when the test ends.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include "hybridflow/core/remove_tree.h"

namespace hybridflow::testing {

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "hybridflow-test-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    hybridflow::remove_tree(path_);  // best effort: a test's leftovers never fail it
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace hybridflow::testing
