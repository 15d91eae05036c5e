// A worker's data socket (the data plane, runtime/data_plane.h): a ROUTER bound on the address this worker
// already uses towards the controller, serving rows of the objects it keeps (object_table.h) to consumers
// in other processes. Requests and replies are authenticated like the controller's messages, with a key
// derived from the job's data secret (shared by every pool of the job; docs/security.md) and the scope
// "data"; peers are numbered by node (pool index << 16 | rank). Requests are small (at most kMaxRequestBytes);
// anything else is dropped, counted and logged once per peer. Runs on the worker's I/O thread, so rows are
// served while a method runs.
//
// Request  "fetch": meta {req, object, keys: [..], runs: [[start, count], ..]}
// (+ shm: the consumer's shared_rows_machine(), keep_s: how long a shared-memory answer is kept for it)
// Reply    "rows":  meta {req}, data: one tensor per key, the runs' rows concatenated
//          "rows_shm": meta {req, shm: SharedRowsOffers::offer's}, the same rows in a sealed memory file
//          (shared_rows.h), when the request named this machine
//          "fetch_error": meta {req, message}
// Request  "release": meta {req}, after a "rows_shm": the consumer mapped the file (or gave up); its
//          descriptor closes here (else when keep_s has passed). No reply.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "message.h"
#include "object_table.h"
#include "shared_rows.h"

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

  // Files of shared-memory answers not yet mapped by their consumers.
  size_t shared_open() const { return shared_.open(); }

 private:
  const ObjectTable& table_;
  SharedRowsOffers shared_;
  zmq::socket_t socket_;
  std::string endpoint_;
  std::unique_ptr<Link> link_;
  RejectLog rejects_;
  size_t rejected_ = 0;
};

}  // namespace hybridflow::transport_detail
