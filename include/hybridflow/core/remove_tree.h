// Recursive removal of a file or directory, without std::filesystem::remove_all.
//
// Why not remove_all: some PyTorch wheels (2.11.0+cu130 seen on an H200 machine) export their own copy of
// std::filesystem::remove_all(const path&, error_code&) from libtorch.so. Our binaries link libtorch before
// libstdc++, so the dynamic linker binds our calls to that copy, which jumps through a null pointer: every
// checkpoint rotation and temporary-directory cleanup segfaulted there. Header-only so that the libtorch-free
// layers and their tests use the same code.
#pragma once

#include <ftw.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace hybridflow {

namespace remove_tree_detail {
// nftw's callback takes no user data; the first failure is kept here for the caller's message.
inline thread_local std::string failure;

inline int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  if (std::remove(path) == 0 || errno == ENOENT) return 0;
  failure = std::string(path) + ": " + std::strerror(errno);
  return 1;
}
}  // namespace remove_tree_detail

// Removes `path` and everything under it, depth first, never following symbolic links (a link is removed,
// not its target). A path that does not exist is not an error. Returns "" on success, else the first entry
// that could not be removed and why.
inline std::string remove_tree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT ? "" : path + ": " + std::strerror(errno);
  remove_tree_detail::failure.clear();
  const int rc = ::nftw(path.c_str(), remove_tree_detail::remove_entry, 32, FTW_DEPTH | FTW_PHYS);
  if (rc == 0) return "";
  if (!remove_tree_detail::failure.empty()) return remove_tree_detail::failure;
  return path + ": " + std::strerror(errno);
}

}  // namespace hybridflow
