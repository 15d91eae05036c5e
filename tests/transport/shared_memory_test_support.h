// What the shared-memory tests look at: a process's open transport memory files (shared_rows.h, by their
// memfd name), the names in /dev/shm (which a memfd never adds to), and whether two tensors hold the same bytes.
#pragma once

#include <sys/types.h>
#include <unistd.h>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <set>
#include <string>

namespace hybridflow::transport_testing {

inline int open_shared_memory_files(pid_t pid = ::getpid()) {
  int n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    std::error_code link_ec;
    const auto target = std::filesystem::read_symlink(e.path(), link_ec);
    if (!link_ec && target.string().find("memfd:hf-rows") != std::string::npos) ++n;
  }
  return n;
}

inline std::set<std::string> dev_shm_names() {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) names.insert(e.path().filename());
  return names;
}

inline bool same_bytes(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const torch::Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.numel() * ca.element_size()) == 0;
}

}  // namespace hybridflow::transport_testing
