// Rows handed to a consumer on the same machine through shared memory instead of the data socket
// (data_server.h, data_fetch.h). Over TCP loopback every byte is MAC'd by the producer, copied into and
// out of the kernel, MAC'd again by the consumer and copied into the input tensor; here the producer
// writes the rows once into an anonymous memory file and the consumer maps it.
//
// The file is a memfd: it has no name in any file system (nothing in /dev/shm to leak) and the kernel frees
// it with its last descriptor or mapping, so a killed producer or consumer leaves nothing behind. The
// producer makes it owner-read-only and seals it (no write, grow, shrink, no new seals) before it names it,
// in its authenticated reply, by pid, descriptor number, device, inode and size. The consumer opens it
// through /proc/<pid>/fd/<n>, which the kernel allows only to processes of the producer's user (who
// can read the job secret anyway: docs/security.md), and refuses a file that is not exactly what the reply
// named, or not sealed. It then maps it copy-on-write: a method that writes into its input changes only
// its own pages. The producer closes its descriptor when the consumer says it has mapped the file, or
// when the offer expires.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hybridflow/core/data_proto.h"

namespace hybridflow::transport_detail {

// "0" (HF_DATA_PLANE_SHM) makes consumers ask for every row over the data socket, even on one machine.
bool shared_rows_enabled();
// "0" (HF_DISPATCH_SHM) sends every tensor of a controller's call inline, even to a rank on this machine
// (message.h).
bool shared_frames_enabled();

// What identifies this machine and pid namespace: the kernel's boot id, the pid namespace's inode and the
// effective user. Two processes with equal ids can name each other's descriptors through /proc (the kernel
// lets a process of the same user open another's /proc/<pid>/fd only while that one is dumpable, so a
// process that is not reports an empty id); empty when unknown, which keeps every transfer on the socket.
const std::string& shared_rows_machine();

// One piece of rows to write: a contiguous CPU tensor's bytes, appended to the key's slot.
struct SharedRowsPart {
  std::string key;
  torch::Tensor rows;  // contiguous
};

// The producer's offers: files written, sealed and kept open until their consumer has mapped them.
class SharedRowsOffers {
 public:
  using Clock = std::chrono::steady_clock;
  // Beyond these (consumers that died before mapping their files), rows go over the socket.
  static constexpr size_t kMaxOpen = 256;
  static constexpr size_t kMaxOpenBytes = size_t(4) << 30;

  explicit SharedRowsOffers(size_t max_open_bytes = kMaxOpenBytes) : max_open_bytes_(max_open_bytes) {}
  ~SharedRowsOffers();
  SharedRowsOffers(const SharedRowsOffers&) = delete;
  SharedRowsOffers& operator=(const SharedRowsOffers&) = delete;

  // Writes the parts (each key's parts one after the other, in order) into a new sealed file kept for
  // `consumer`'s request `req` until released or `keep_s` has passed. Returns the reply's meta
  // {pid, fd, dev, ino, bytes, machine, slots: [{key, offset, bytes}]}, or nullopt when no file can be
  // made here (too many open files or bytes, nothing to write, no memfd): the caller answers over the socket.
  std::optional<nlohmann::json> offer(int consumer, int64_t req, const std::vector<SharedRowsPart>& parts,
                                       double keep_s);
  // The consumer mapped it (or gave up): the descriptor closes; unknown pairs are ignored.
  void release(int consumer, int64_t req);
  // Closes the descriptors of offers whose time has passed.
  void expire(Clock::time_point now = Clock::now());
  size_t open() const { return offers_.size(); }

 private:
  struct Offer {
    int fd;
    size_t bytes;
    int consumer;
    int64_t req;
    Clock::time_point deadline;
  };
  std::vector<Offer> offers_;
  size_t max_open_bytes_;
  size_t open_bytes_ = 0;
  void close_offer(std::vector<Offer>::iterator it);
};

// A producer's file, mapped by the consumer: tensors are views into one private mapping, which lives as
// long as any of them.
class SharedRowsMapping {
 public:
  // Maps the file an authenticated "rows_shm" reply names. nullopt: the file cannot be reached from here
  // (another machine or pid namespace, /proc not readable): ask over the socket. Throws an Error when it
  // can be reached but is not the file the reply named (another inode or size, not sealed, writable).
  static std::optional<SharedRowsMapping> open(const nlohmann::json& reply);
  // The slot `key`, as `dtype` with `shape`: an Error when the reply has no such slot or its bytes differ.
  torch::Tensor tensor(const std::string& key, c10::ScalarType dtype, const std::vector<int64_t>& shape) const;
  // The slot `key`'s bytes, keeping the mapping alive; nullopt when the file has no such slot.
  std::optional<Buffer> slot(const std::string& key) const;
  size_t bytes() const { return bytes_; }

 private:
  std::shared_ptr<void> base_;
  size_t bytes_ = 0;
  std::map<std::string, std::pair<size_t, size_t>> slots_;  // key -> offset, bytes
};

}  // namespace hybridflow::transport_detail
