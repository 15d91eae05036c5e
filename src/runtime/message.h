// Controller <-> worker messages over ZeroMQ. Multipart layout (after the ROUTER's identity frame):
//   token | kind | meta JSON | [DataProto header | payload 0 | payload 1 ...]
// Tensor payloads are sent without copying: the zmq message keeps a reference to the tensor.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "hybridflow/core/data_proto.h"

namespace hybridflow::runtime_detail {

struct Message {
  std::string kind;
  nlohmann::json meta = nlohmann::json::object();
  std::optional<DataProto> data;
};

// identity: the ROUTER frame naming the peer, empty for a DEALER socket.
void send_message(zmq::socket_t& socket, const std::string& identity, const std::string& token,
                  const Message& message);

struct Received {
  std::string identity;
  std::optional<Message> message;  // empty when the token was wrong or the frames malformed
  std::string rejected_reason;
};

// Receives one multipart message if one is ready (non-blocking); nullopt when none.
std::optional<Received> try_receive(zmq::socket_t& socket, bool router, const std::string& token);

}  // namespace hybridflow::runtime_detail

#include "hybridflow/runtime/mesh_coord.h"
namespace hybridflow::runtime_detail {
nlohmann::json coord_to_json(const MeshCoord& c);
MeshCoord coord_from_json(const nlohmann::json& j);
std::string host_name();

// Environment contract between a controller and the worker processes it spawns.
inline constexpr const char* kEndpointEnv = "HF_WORKER_ENDPOINT";
inline constexpr const char* kTokenEnv = "HF_WORKER_TOKEN";
inline constexpr const char* kRankEnv = "HF_WORKER_RANK";
inline constexpr const char* kPoolEnv = "HF_WORKER_POOL";
inline constexpr double kHeartbeatPeriodS = 0.25;
}  // namespace hybridflow::runtime_detail

namespace hybridflow::runtime_detail {
// Lets other threads wake a thread blocked in zmq::poll (zmq sockets are single-threaded, so only
// the I/O thread touches them; others queue work and write one byte here).
class WakePipe {
 public:
  WakePipe();
  ~WakePipe();
  WakePipe(const WakePipe&) = delete;
  WakePipe& operator=(const WakePipe&) = delete;
  void notify();
  void drain();
  int fd() const { return fds_[0]; }

 private:
  int fds_[2] = {-1, -1};
};
}  // namespace hybridflow::runtime_detail
