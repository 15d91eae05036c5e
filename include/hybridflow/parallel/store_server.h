// A c10d TCPStore server on its own, for a rendezvous that no rank hosts: the controller starts one per
// worker group, and the group's ranks join it with ProcessGroupOptions::rank0_hosts_store = false. It
// listens on one address only: c10d's store has no authentication, so it must not be reachable from
// more of the network than the job needs (loopback for one machine; the controller's address, where the
// workers already reach it, for several; docs/security.md).
#pragma once

#include <chrono>
#include <memory>
#include <string>

namespace hybridflow {

class StoreServer {
 public:
  // Binds a free port (0) or the given one on `host` (an IPv4 address or name; "0.0.0.0" = every
  // interface); Error naming the address when it cannot listen.
  static std::shared_ptr<StoreServer> start(int port = 0,
                                            std::chrono::milliseconds timeout = std::chrono::seconds(60),
                                            const std::string& host = "127.0.0.1");
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }
  // Sets `key` in the store for its clients to read (ProcessGroup::store_value).
  void set(const std::string& key, const std::string& value);

  struct Impl;

 private:
  StoreServer(std::unique_ptr<Impl> impl, int port);
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace hybridflow
