// A c10d TCPStore server on its own, for a rendezvous that no rank hosts: the controller starts one per
// worker group, and the group's ranks join it with ProcessGroupOptions::rank0_hosts_store = false. It
// listens on every interface of this host (as c10d does), so ranks on other hosts reach it through
// whatever address they already use for this machine.
#pragma once

#include <chrono>
#include <memory>

namespace hybridflow {

class StoreServer {
 public:
  // Binds a free port (0) or the given one; Error naming the port when it cannot listen.
  static std::shared_ptr<StoreServer> start(int port = 0,
                                            std::chrono::milliseconds timeout = std::chrono::seconds(60));
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }

  struct Impl;

 private:
  StoreServer(std::unique_ptr<Impl> impl, int port);
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace hybridflow
