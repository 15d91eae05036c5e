#include "hybridflow/parallel/store_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "hybridflow/core/error.h"

namespace hybridflow {
namespace {

// A listening IPv4 socket on host:port. c10d's own server listens on every interface and has no option
// for an address, so the store is handed this socket instead (TCPStoreOptions::masterListenFd).
int listen_on(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  HF_CHECK(rc == 0 && found != nullptr, "store server: listen address '", host, "' does not resolve to an IPv4 "
           "address (", ::gai_strerror(rc), ")");
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(found->ai_addr);
  ::freeaddrinfo(found);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  HF_CHECK(fd >= 0, "store server: cannot create a socket: ", std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 128) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    HF_FAIL("store server: cannot listen on ", host, ":", port, ": ", why);
  }
  return fd;
}

int port_of(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  HF_CHECK(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0, "store server: getsockname failed: ",
           std::strerror(errno));
  return ntohs(addr.sin_port);
}

}  // namespace

struct StoreServer::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

std::shared_ptr<StoreServer> StoreServer::start(int port, std::chrono::milliseconds timeout, const std::string& host) {
  HF_CHECK(port >= 0 && port < 65536, "store server: port ", port, " is not a TCP port (0 = any free one)");
  const int fd = listen_on(host, port);
  const int bound = port_of(fd);
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(bound);
  options.isServer = true;
  options.waitWorkers = false;  // the ranks' own rendezvous waits for them
  options.timeout = timeout;
  options.masterListenFd = fd;  // the store owns (and closes) it from here on
  auto impl = std::make_unique<Impl>();
  try {
    // The server's own client connection reaches it where it listens.
    impl->store = c10::make_intrusive<c10d::TCPStore>(host == "0.0.0.0" ? "127.0.0.1" : host, options);
  } catch (const std::exception& e) {
    HF_FAIL("store server: cannot listen on ", host, ":", bound, ": ", e.what());
  }
  HF_CHECK(impl->store->getPort() == bound, "store server: listens on port ", bound, " but the store reports port ",
           impl->store->getPort());
  return std::shared_ptr<StoreServer>(new StoreServer(std::move(impl), bound));
}

StoreServer::StoreServer(std::unique_ptr<Impl> impl, int port) : impl_(std::move(impl)), port_(port) {}

StoreServer::~StoreServer() = default;

void StoreServer::set(const std::string& key, const std::string& value) {
  impl_->store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

}  // namespace hybridflow
