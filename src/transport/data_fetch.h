// The consumer end of the data plane (runtime/data_plane.h): before a method runs, a worker turns the
// call's plan into the input tensors the plan names, reading rows of objects this process keeps directly
// (without copying where one object's rows are the whole tensor) and fetching the others from the
// producers' data sockets (data_server.h), each reply bounded below HF_MAX_MESSAGE_BYTES; a producer on the
// same machine answers with a sealed shared-memory file that this process maps (shared_rows.h; falling back
// to the socket when the file cannot be reached, HF_DATA_PLANE_SHM=0 always uses the socket). Where one
// answer holds all of an input's rows it becomes the input tensor, uncopied. A producer that
// does not answer within the plan's timeout, refuses or drops the connection, or answers with an error
// becomes an Error naming its pool, role, rank, pid, host and socket. Runs on the worker's executor thread.
//
// The plan (meta "plan" of a call request):
//   {rows, timeout_s, tensors: {key: {dtype, shape: [dims after the first]}},
//    pieces: [{source: {node, endpoint, pool, role, method, rank, pid, host}, object,
//              keys: {input key: key in the object}, runs: [[start, count, first input row], ..]}]}
// Every input key's rows are covered exactly once by the runs of the pieces that name it.
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "message.h"
#include "object_table.h"

namespace hybridflow::transport_detail {

class InputFetcher {
 public:
  InputFetcher(zmq::context_t& context, const ObjectTable& table);
  ~InputFetcher();
  InputFetcher(const InputFetcher&) = delete;
  InputFetcher& operator=(const InputFetcher&) = delete;
  // The controller named this worker's node (its welcome); plans can be served from then on.
  void start(const std::string& secret, int node);

  struct Result {
    uint64_t fetched_bytes = 0;                            // tensor bytes received from other processes
    std::vector<std::pair<int64_t, std::string>> shared;  // (object, key) handed to the method without a copy
  };
  // `inline_part` (what the controller sent) plus the plan's tensors.
  DataProto assemble(DataProto inline_part, const nlohmann::json& plan, Result* result);

 private:
  struct Peer;
  Peer& peer(const nlohmann::json& source);

  zmq::context_t& context_;
  const ObjectTable& table_;
  int node_ = -1;
  std::unique_ptr<Link> link_;
  std::map<std::string, std::unique_ptr<Peer>> peers_;  // by endpoint, kept connected across calls
  int64_t next_request_ = 1;
};

}  // namespace hybridflow::transport_detail
