// One call for many ranks of one worker process (simulated workers, worker_main.h): the controller sends a
// request that every rank of a process gets alike (a one-to-all call) once, to the process's lowest rank, with
// the list of ranks; that rank hands a copy to each rank's executor and sends back one merged reply. Each rank
// still runs the method on its own executor thread, with its own worker object, and answers for itself:
// the merged reply keeps every rank's result or error apart, so the controller's bookkeeping is per rank as
// before, while it sends and reads one message per process instead of one per rank.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "transport/message.h"

namespace hybridflow::runtime_detail {

// Messages a rank's I/O thread sends next, posted by other threads (its executor, or the executor of the
// last rank of a batch it leads); shared so that a batch finishing late never writes to a rank gone.
class RankMailbox {
 public:
  void post(transport_detail::Message message);
  std::vector<transport_detail::Message> take();
  int wake_fd() const { return wake_.fd(); }
  void drain_wake() { wake_.drain(); }

 private:
  transport_detail::WakePipe wake_;
  std::mutex mutex_;
  std::vector<transport_detail::Message> out_;
};

// Results of one call on the ranks of one batch, merged into one "results" message for the leading rank:
// meta {call_id, done: [rank, ...], parts: [{rank, kind, meta, data}]}, each in the order of the request's
// rank list. "done" lists the ranks whose result is an empty DataProto with nothing else to say (an empty
// call's usual answer: one number each instead of an object); every other rank has a part. A part's data is
// "empty" (an empty DataProto), the index of a carrier tensor (a small DataProto, serialized) or absent (an
// error, or a result too big to copy: that rank sent it on its own connection, and the part says "separate").
class RankBatch {
 public:
  RankBatch(int64_t call_id, std::vector<int> ranks, std::shared_ptr<RankMailbox> leader);
  // The reply ("result" or "error") of the rank at `slot` of the rank list; `own` is that rank's mailbox, for
  // a result sent separately.
  void finish(size_t slot, transport_detail::Message reply, RankMailbox& own);

  // Results larger than this (tensor bytes; less when HF_MAX_MESSAGE_BYTES is small) travel on their rank's
  // own connection, without a copy.
  static constexpr int64_t kMergedResultBytes = 64 << 10;

 private:
  std::mutex mutex_;
  int64_t call_id_;
  std::vector<int> ranks_;
  std::shared_ptr<RankMailbox> leader_;
  struct Part {
    bool answered = false;
    bool done = false;       // an empty result: listed in "done", no part
    nlohmann::json json;     // the part otherwise
    std::string carried;     // a small result, serialized
  };
  std::vector<Part> parts_;  // by slot
  size_t answered_ = 0;
};

// A request queued on a rank's executor. A batch's ranks share one decoded request (`message`, immutable,
// without its data); each has its own "after", its own copy of the input (`data`) and its slot in `batch`.
// A rank's own request (batch null) carries its "after" (-1: none) and data the same way.
struct RankRequest {
  std::shared_ptr<const transport_detail::Message> message;
  int64_t after = -1;
  std::optional<DataProto> data;
  std::shared_ptr<RankBatch> batch;
  size_t slot = 0;
  // A request that came on the rank's own connection.
  static RankRequest alone(transport_detail::Message message);
};

// The ranks this process serves, for the leading rank of a batch to reach the others' executors.
// submit(rank, request): queues a call on that rank's executor (thread-safe).
//
// Heartbeats, per process: each rank's I/O thread still notes every period that it is alive, with its
// data-plane figures (beat), but only one rank (the lowest whose I/O thread noted itself lately) sends a
// heartbeat, naming the others that did; a rank whose thread is gone or stuck drops out of it, and the
// controller fails it as before. The controller's heartbeats likewise reach one rank of a process (the one it
// sends batches to): every rank counts what any rank of the process heard from the controller.
class RankDirectory {
 public:
  using Submit = std::function<void(RankRequest)>;
  using Clock = std::chrono::steady_clock;
  static RankDirectory& process();
  void add(int rank, Submit submit);
  void remove(int rank);  // before the rank's executor goes
  // False when this process does not serve `rank` (any more).
  bool submit(int rank, RankRequest request);

  // Rank `rank` is alive at `now`, with these figures for its heartbeat ({rank, objects, ...}). Returns the
  // figures of the other ranks alive lately when `rank` is the one to send the process's heartbeat.
  std::optional<nlohmann::json> beat(int rank, nlohmann::json figures, Clock::time_point now);
  void heard_from_controller(Clock::time_point now);
  Clock::time_point last_heard_from_controller() const;

 private:
  struct Beat {
    nlohmann::json figures;
    Clock::time_point at;
  };
  mutable std::mutex mutex_;
  std::map<int, Submit> ranks_;
  std::map<int, Beat> beats_;
  Clock::time_point heard_{};
};

// Runs a batched request (meta "ranks": [[rank, after], ...]) on every listed rank of this process: each
// gets the request without the list (one decoded copy shared by all), with its own "after", and its own copy
// of the input's tensors.
void dispatch_rank_batch(transport_detail::Message request, const std::shared_ptr<RankMailbox>& leader);

// Executor-side ordering: a rank that shares its process hears of calls on two paths (its own connection,
// and batches through the leading rank), so each of its requests names the call the controller sent it before
// ("after", 0 for none); the rank runs requests in that order, holding back one that overtook its predecessor.
// Requests without "after" (a rank alone in its process: one path) run in arrival order.
class CallOrder {
 public:
  // The requests ready to run, in order, now that `request` arrived.
  std::vector<RankRequest> arrive(RankRequest request);

 private:
  int64_t last_ = 0;                        // the call that ran last on this path
  std::map<int64_t, RankRequest> held_;     // by the call they wait for
};

}  // namespace hybridflow::runtime_detail
