#include "hybridflow/transport/net_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "hybridflow/core/error.h"

namespace hybridflow {

std::string endpoint_host(const std::string& endpoint) {
  std::string rest = endpoint;
  const size_t scheme = rest.find("://");
  if (scheme != std::string::npos) rest = rest.substr(scheme + 3);
  std::string host;
  if (!rest.empty() && rest.front() == '[') {
    const size_t close = rest.find(']');
    HF_CHECK(close != std::string::npos, "endpoint '", endpoint, "': unbalanced '[' around an IPv6 address");
    host = rest.substr(1, close - 1);
  } else {
    host = rest.substr(0, rest.rfind(':'));
  }
  HF_CHECK(!host.empty(), "endpoint '", endpoint, "' names no host (expected tcp://HOST:PORT)");
  return host;
}

std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), "9", &hints, &found);
  HF_CHECK(rc == 0, "cannot resolve the host '", host, "': ", ::gai_strerror(rc));
  std::string out;
  for (addrinfo* a = found; a != nullptr && out.empty(); a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    // Connecting a UDP socket only asks the kernel for a route; the local end is the address peers use.
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* addr = local.ss_family == AF_INET6
                             ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                             : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
      if (::inet_ntop(local.ss_family, addr, text, sizeof(text)) != nullptr) out = text;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  HF_CHECK(!out.empty(), "no local address has a route to the host '", host, "'");
  return out;
}

}  // namespace hybridflow
