#include "shared_rows.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <torch/torch.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "hybridflow/core/error.h"

#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U
#endif

namespace hybridflow::transport_detail {
namespace {

constexpr size_t kSlotAlignment = 64;
constexpr unsigned kSharedRowsSeals = F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;

size_t slot_aligned(size_t n) { return (n + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment; }

// A descriptor closed with its owner (the consumer's end, until mapped).
struct SharedRowsFd {
  int fd = -1;
  ~SharedRowsFd() {
    if (fd >= 0) ::close(fd);
  }
};

int make_rows_memfd() {
  // Not executable, sealable; older kernels do not know MFD_NOEXEC_SEAL.
  int fd = ::memfd_create("hf-rows", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL);
  if (fd < 0 && errno == EINVAL) fd = ::memfd_create("hf-rows", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  return fd;
}

bool write_rows_at(int fd, const void* data, size_t size, size_t offset) {
  const auto* at = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, at, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    at += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<size_t>(n);
  }
  return true;
}

bool shared_memory_switch_on(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::string(v) != "0";
}

}  // namespace

bool shared_rows_enabled() {
  static const bool enabled = shared_memory_switch_on("HF_DATA_PLANE_SHM");
  return enabled;
}

bool shared_frames_enabled() {
  static const bool enabled = shared_memory_switch_on("HF_DISPATCH_SHM");
  return enabled;
}

const std::string& shared_rows_machine() {
  static const std::string id = [] {
    std::string boot;
    std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
    struct stat ns {};
    if (boot.empty() || ::stat("/proc/self/ns/pid", &ns) != 0) return std::string();
    if (::prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 1) return std::string();
    return boot + "/" + std::to_string(ns.st_dev) + ":" + std::to_string(ns.st_ino) + "/uid" +
           std::to_string(::geteuid());
  }();
  return id;
}

SharedRowsOffers::~SharedRowsOffers() {
  for (const auto& o : offers_) ::close(o.fd);
}

std::optional<nlohmann::json> SharedRowsOffers::offer(int consumer, int64_t req, const std::vector<SharedRowsPart>& parts,
                                                      double keep_s) {
  if (offers_.size() >= kMaxOpen || shared_rows_machine().empty()) return std::nullopt;
  // Slots: each key's parts back to back, every slot starting on a 64-byte boundary.
  std::map<std::string, std::pair<size_t, size_t>> slots;
  std::vector<std::string> order;
  for (const auto& p : parts)
    if (!slots.count(p.key)) {
      slots[p.key] = {0, 0};
      order.push_back(p.key);
    }
  size_t total = 0;
  for (const auto& key : order) {
    size_t bytes = 0;
    for (const auto& p : parts)
      if (p.key == key) bytes += p.rows.numel() * p.rows.element_size();
    slots[key] = {total, bytes};
    total = slot_aligned(total + bytes);
  }
  if (total == 0 || open_bytes_ + total > max_open_bytes_) return std::nullopt;
  const int fd = make_rows_memfd();
  if (fd < 0) return std::nullopt;
  SharedRowsFd guard{fd};
  if (::fchmod(fd, 0400) != 0 || ::ftruncate(fd, static_cast<off_t>(total)) != 0) return std::nullopt;
  std::map<std::string, size_t> written;
  for (const auto& p : parts) {
    HF_CHECK(p.rows.device().is_cpu() && p.rows.is_contiguous(), "shared rows: tensor '", p.key,
             "' must be CPU and contiguous");
    const size_t bytes = p.rows.numel() * p.rows.element_size();
    if (bytes > 0 && !write_rows_at(fd, p.rows.data_ptr(), bytes, slots[p.key].first + written[p.key])) return std::nullopt;
    written[p.key] += bytes;
  }
  if (::fcntl(fd, F_ADD_SEALS, kSharedRowsSeals) != 0) return std::nullopt;
  struct stat st {};
  if (::fstat(fd, &st) != 0) return std::nullopt;
  nlohmann::json out_slots = nlohmann::json::array();
  for (const auto& key : order) out_slots.push_back({{"key", key}, {"offset", slots[key].first}, {"bytes", slots[key].second}});
  const auto keep = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(keep_s));
  offers_.push_back({fd, total, consumer, req, Clock::now() + keep});
  open_bytes_ += total;
  guard.fd = -1;
  return nlohmann::json{{"pid", static_cast<int64_t>(::getpid())},
                        {"fd", fd},
                        {"dev", static_cast<uint64_t>(st.st_dev)},
                        {"ino", static_cast<uint64_t>(st.st_ino)},
                        {"bytes", total},
                        {"machine", shared_rows_machine()},
                        {"slots", out_slots}};
}

void SharedRowsOffers::close_offer(std::vector<Offer>::iterator it) {
  ::close(it->fd);
  open_bytes_ -= it->bytes;
  offers_.erase(it);
}

void SharedRowsOffers::release(int consumer, int64_t req) {
  for (auto it = offers_.begin(); it != offers_.end(); ++it)
    if (it->consumer == consumer && it->req == req) return close_offer(it);
}

void SharedRowsOffers::expire(Clock::time_point now) {
  for (size_t i = offers_.size(); i-- > 0;)
    if (offers_[i].deadline <= now) close_offer(offers_.begin() + static_cast<std::ptrdiff_t>(i));
}

std::optional<SharedRowsMapping> SharedRowsMapping::open(const nlohmann::json& reply) {
  const std::string machine = reply.at("machine").get<std::string>();
  if (machine.empty() || machine != shared_rows_machine()) return std::nullopt;  // not reachable from here
  const int64_t pid = reply.at("pid").get<int64_t>(), fd_number = reply.at("fd").get<int64_t>();
  const uint64_t dev = reply.at("dev").get<uint64_t>(), ino = reply.at("ino").get<uint64_t>();
  const size_t bytes = reply.at("bytes").get<size_t>();
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd_number);
  SharedRowsFd file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) return std::nullopt;  // /proc hidden or the descriptor not ours to open: the socket will do
  struct stat st {};
  HF_CHECK(::fstat(file.fd, &st) == 0, "shared rows: cannot stat ", path, ": ", std::strerror(errno));
  HF_CHECK(S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_dev) == dev && static_cast<uint64_t>(st.st_ino) == ino,
           "shared rows: refused ", path, ": it is not the file the producer's reply names (inode ", st.st_ino,
           ", expected ", ino, ")");
  HF_CHECK(static_cast<uint64_t>(st.st_size) == bytes, "shared rows: refused ", path, ": it has ", st.st_size,
           " bytes, the producer's reply says ", bytes, " (truncated or grown)");
  const int seals = ::fcntl(file.fd, F_GET_SEALS);
  HF_CHECK(seals >= 0 && (static_cast<unsigned>(seals) & kSharedRowsSeals) == kSharedRowsSeals, "shared rows: refused ",
           path, ": it is not sealed against writes and resizing (seals ", seals, ")");
  HF_CHECK((st.st_mode & 0222) == 0, "shared rows: refused ", path, ": it is writable (mode ", std::oct,
           (st.st_mode & 0777), ")");
  HF_CHECK(bytes > 0, "shared rows: refused ", path, ": an empty file");
  // Private: writes by the method stay in this process (copy on write), never reach the producer's file.
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, file.fd, 0);
  HF_CHECK(base != MAP_FAILED, "shared rows: cannot map ", path, " (", bytes, " bytes): ", std::strerror(errno));
  SharedRowsMapping out;
  out.base_ = std::shared_ptr<void>(base, [bytes](void* p) { ::munmap(p, bytes); });
  out.bytes_ = bytes;
  for (const auto& s : reply.at("slots")) {
    const size_t offset = s.at("offset").get<size_t>(), size = s.at("bytes").get<size_t>();
    HF_CHECK(offset % kSlotAlignment == 0 && offset <= bytes && size <= bytes - offset, "shared rows: refused ", path,
             ": slot '", s.at("key").get<std::string>(), "' [", offset, ", +", size, ") lies outside its ", bytes,
             " bytes");
    out.slots_[s.at("key").get<std::string>()] = {offset, size};
  }
  return out;
}

std::optional<Buffer> SharedRowsMapping::slot(const std::string& key) const {
  auto it = slots_.find(key);
  if (it == slots_.end()) return std::nullopt;
  return Buffer{static_cast<const char*>(base_.get()) + it->second.first, it->second.second, base_};
}

torch::Tensor SharedRowsMapping::tensor(const std::string& key, c10::ScalarType dtype,
                                        const std::vector<int64_t>& shape) const {
  auto it = slots_.find(key);
  HF_CHECK(it != slots_.end(), "shared rows: the producer's file has no tensor '", key, "'");
  size_t bytes = c10::elementSize(dtype);
  for (int64_t d : shape) bytes *= static_cast<size_t>(d);
  HF_CHECK(bytes == it->second.second, "shared rows: tensor '", key, "' has ", it->second.second,
           " bytes in the producer's file, not the ", bytes, " its rows need (truncated?)");
  if (bytes == 0) return torch::empty(shape, torch::TensorOptions().dtype(dtype));
  std::shared_ptr<void> keep = base_;
  return torch::from_blob(static_cast<char*>(base_.get()) + it->second.first, shape,
                          [keep](void*) mutable { keep.reset(); }, torch::TensorOptions().dtype(dtype));
}

}  // namespace hybridflow::transport_detail
