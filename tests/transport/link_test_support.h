// Two ends of a message link joined in-process, and what an eavesdropper or intruder does with them
// (record, replay, send raw frames): shared by the transport's link tests and the runtime's attack tests.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "transport/message.h"

namespace hybridflow::transport_testing {

using transport_detail::Link;
using transport_detail::Received;

inline const std::string kSecret = "5c8e1f0a7b3d4e6f9a2c1b8d7e0f3a4c";

// A controller-side ROUTER and a worker-side DEALER joined in-process.
struct SocketPair {
  zmq::context_t context{1};
  zmq::socket_t router{context, zmq::socket_type::router};
  zmq::socket_t dealer{context, zmq::socket_type::dealer};
  std::string identity;
  SocketPair() {
    router.set(zmq::sockopt::linger, 0);
    dealer.set(zmq::sockopt::linger, 0);
    Link::limit(router);
    router.bind("inproc://pair");
    dealer.connect("inproc://pair");
  }
};

// Receives whatever arrives next (blocking up to 5 s).
inline std::optional<Received> next(Link& link, zmq::socket_t& socket, bool router) {
  zmq::pollitem_t items[] = {{socket.handle(), 0, ZMQ_POLLIN, 0}};
  zmq::poll(items, 1, std::chrono::seconds(5));
  return link.receive(socket, router);
}

// The raw frames of the next message on `socket` (what an eavesdropper records).
inline std::vector<std::string> record(zmq::socket_t& socket) {
  std::vector<std::string> frames;
  zmq::message_t frame;
  do {
    EXPECT_TRUE(socket.recv(frame));
    frames.push_back(frame.to_string());
  } while (frame.more());
  return frames;
}

inline void send_raw(zmq::socket_t& socket, const std::vector<std::string>& frames) {
  for (size_t i = 0; i < frames.size(); ++i)
    socket.send(zmq::buffer(frames[i]), i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
}

inline transport_detail::Message hello(int rank) { return {"hello", {{"rank", rank}, {"host", "evil\nERROR forged"}}, std::nullopt}; }

// An intruder DEALER on `endpoint`.
inline zmq::socket_t intruder(zmq::context_t& context, const std::string& endpoint) {
  zmq::socket_t s(context, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.connect(endpoint);
  return s;
}

}  // namespace hybridflow::transport_testing
