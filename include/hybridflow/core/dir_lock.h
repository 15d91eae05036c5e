// An exclusive lock on a directory for the lifetime of a run, so that two runs never write the same
// checkpoints and metrics (a rename racing a rename, a metrics line written twice).
#pragma once

#include <string>

namespace hybridflow {

class DirectoryLock {
 public:
  // Creates `dir` if needed and takes an exclusive flock on <dir>/.hybridflow.lock, which records this
  // process's pid. Throws hybridflow::Error naming the directory and the holder's pid when another
  // process holds it. The lock goes with the process, also when it is killed.
  explicit DirectoryLock(const std::string& dir);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace hybridflow
