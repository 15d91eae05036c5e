// Addresses a process offers its peers: the host part of an endpoint, and the local address on the route
// to another host (what Gloo and the data plane's sockets bind to, so that they are reachable from there
// and not more widely than needed).
#pragma once

#include <string>

namespace hybridflow {

// "tcp://10.0.0.5:4000" -> "10.0.0.5" ("[::1]:4000" -> "::1"); Error when there is no host.
std::string endpoint_host(const std::string& endpoint);

// This host's address on the route to `host` (a connected UDP socket; nothing is sent).
std::string local_address_towards(const std::string& host);

}  // namespace hybridflow
