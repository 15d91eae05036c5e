// The two sides of a launcher rendezvous (see hybridflow/transport/launcher.h): the controller rank's
// server, which hands launcher ranks to resource pools, and the worker ranks' join loop.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "hybridflow/transport/launcher.h"
#include "hybridflow/transport/process_pool.h"
#include "message.h"

namespace hybridflow::transport_detail {

class Rendezvous {
 public:
  explicit Rendezvous(const LaunchSettings& settings);  // listens at once; Error naming the address
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  // Claims the next worker ranks for each (pool, size), in order, all or none. Error naming the
  // numbers when they are more than the ranks left.
  void reserve(const std::vector<std::pair<std::string, int>>& pools);

  struct Claim {
    ResourcePool spec;          // what the pool must listen with: external workers, the job token
    std::vector<int> ranks;     // launcher rank of each pool rank
  };
  // The spec for a pool served by launcher ranks (reserving them now unless reserve() did).
  Claim claim(const ResourcePool& spec);
  // Tells the claimed ranks to connect to the pool listening on `port`.
  void hand_out(const ResourcePool& spec, const std::vector<int>& ranks, int port);

  // At exit: ranks no pool claimed are told to exit 0 (they get a few seconds to ask).
  void release_unclaimed();

  size_t rejected_messages() const { return rejected_.load(); }

 private:
  struct RankState {
    bool joined = false;
    std::string identity;  // the ZeroMQ peer of its first authenticated join: the only one answered
    std::string host;      // escaped for logs
    Message answer{"wait", {}, std::nullopt};
    bool final_answer = false;  // assign or release
    bool delivered = false;     // the final answer went out
  };
  void loop();
  void reject(const Received& received, const std::string& code, const std::string& why);

  LaunchSettings settings_;
  zmq::context_t context_{1};
  zmq::socket_t router_{context_, zmq::socket_type::router};
  Link link_;  // I/O thread only (after the constructor)
  RejectLog reject_log_{"launch controller"};
  WakePipe wake_;
  std::mutex mutex_;
  std::vector<RankState> ranks_;
  std::vector<int> free_ranks_;  // ascending, not yet claimed
  std::map<std::string, std::vector<int>> reserved_;
  int pools_listening_ = 0;
  bool stopping_ = false;
  std::atomic<size_t> rejected_{0};
  std::thread io_;
};

// The process-wide server of the controller rank of a multi-rank launch, started on first call;
// nullptr in every other process. Releases unclaimed ranks at exit.
Rendezvous* launch_rendezvous();

// A worker rank: joins the controller's rendezvous. Given a pool, it sets the worker environment
// (HF_WORKER_ENDPOINT, ...) and returns nullopt: the caller then serves that pool (run_worker_main).
// Returns the exit code when released or when the controller is gone.
std::optional<int> run_launched_worker(const LaunchSettings& settings);

}  // namespace hybridflow::transport_detail
