#include "hybridflow/parallel/store_server.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "hybridflow/core/error.h"

namespace hybridflow {

struct StoreServer::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

std::shared_ptr<StoreServer> StoreServer::start(int port, std::chrono::milliseconds timeout) {
  HF_CHECK(port >= 0 && port < 65536, "store server: port ", port, " is not a TCP port (0 = any free one)");
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(port);
  options.isServer = true;
  options.waitWorkers = false;  // the ranks' own rendezvous waits for them
  options.timeout = timeout;
  auto impl = std::make_unique<Impl>();
  try {
    // The server itself binds every interface; the host only serves its own client connection.
    impl->store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  } catch (const std::exception& e) {
    HF_FAIL("store server: cannot listen on port ", port, ": ", e.what());
  }
  const int bound = impl->store->getPort();
  HF_CHECK(bound > 0, "store server: asked for port ", port, " but the store reports port ", bound);
  return std::shared_ptr<StoreServer>(new StoreServer(std::move(impl), bound));
}

StoreServer::StoreServer(std::unique_ptr<Impl> impl, int port) : impl_(std::move(impl)), port_(port) {}

StoreServer::~StoreServer() = default;

}  // namespace hybridflow
