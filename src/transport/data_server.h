// A worker's data socket (the data plane, runtime/data_plane.h): a ROUTER bound on the address this worker
// already uses towards the controller, serving rows of the objects it keeps (object_table.h) to consumers
// in other processes. Requests and replies are authenticated like the controller's messages, with a key
// derived from the job's data secret (shared by every pool of the job; docs/security.md) and the scope
// "data"; peers are numbered by node (pool index << 16 | rank). Requests are small (at most kMaxRequestBytes);
// anything else is dropped, counted and logged once per peer. Runs on the worker's I/O thread, so rows are
// served while a method runs.
//
// Request  "fetch": meta {req, object, keys: [..], runs: [[start, count], ..]}
// Reply    "rows":  meta {req}, data: one tensor per key, the runs' rows concatenated
//          "fetch_error": meta {req, message}
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "message.h"
#include "object_table.h"

namespace hybridflow::transport_detail {

inline constexpr size_t kMaxRequestBytes = size_t(1) << 20;
inline constexpr const char* kDataScope = "data";

class DataServer {
 public:
  // Binds tcp://host:* (Error when it cannot).
  DataServer(zmq::context_t& context, const std::string& host, const ObjectTable& table, std::string where);
  const std::string& endpoint() const { return endpoint_; }
  zmq::socket_t& socket() { return socket_; }
  // Serving starts once the controller named this worker's node (its welcome); before that nothing is answered.
  void start(const std::string& secret, int node);
  // Answers every request that is ready (non-blocking).
  void serve();
  size_t rejected() const { return rejected_; }

 private:
  const ObjectTable& table_;
  zmq::socket_t socket_;
  std::string endpoint_;
  std::unique_ptr<Link> link_;
  RejectLog rejects_;
  size_t rejected_ = 0;
};

}  // namespace hybridflow::transport_detail
