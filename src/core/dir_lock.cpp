#include "hybridflow/core/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"

namespace hybridflow {

DirectoryLock::DirectoryLock(const std::string& dir) : path_(dir + "/.hybridflow.lock") {
  make_dirs(dir);
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  HF_CHECK(fd_ >= 0, "cannot open lock file ", path_, ": ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[32] = {0};
    const ssize_t n = ::pread(fd_, holder, sizeof(holder) - 1, 0);
    ::close(fd_);
    fd_ = -1;
    HF_CHECK(err != EWOULDBLOCK, "run directory ", dir, " is in use by another hybridflow run (pid ",
             n > 0 ? std::string(holder, static_cast<size_t>(n)) : std::string("unknown"), ", lock ", path_,
             "); wait for it to finish or use another trainer.run_dir");
    HF_FAIL("cannot lock ", path_, ": ", std::strerror(err));
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    // The pid is only for the message another run prints; the lock itself holds.
  }
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

}  // namespace hybridflow
