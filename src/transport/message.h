// Controller <-> worker messages over ZeroMQ. Multipart layout (after the ROUTER's identity frame):
//   auth | kind | meta JSON | [DataProto header | payload 0 | payload 1 ...]
// auth = "HFm2" | sender (int32 LE) | sequence number (uint64 LE) | the sending link's random nonce (16 bytes)
// | tag (16 bytes): the MAC of frame_mac.h over the scope, sender, receiver, sequence number, nonce and every
// later frame. The keys are derived from the job secret, which itself never travels; a receiver accepts from
// each sender only increasing sequence numbers (no replays).
// Sizes are checked while the frames arrive, before anything is verified or decoded.
// Tensor payloads are sent without copying: the zmq message keeps a reference to the tensor.
// To a rank on the same machine, a call's big tensor payloads (at least kSharedFrameMinBytes each) go
// through one sealed memory file instead (shared_rows.h): their frames are sent empty and the meta JSON
// names the file under kSharedFramesKey, which the MAC covers like any other meta. The receiver maps the
// file, checks it exactly as the data plane does, and decodes the tensors on the mapping (copy on write).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "frame_mac.h"
#include "hybridflow/core/data_proto.h"
#include "shared_rows.h"

namespace hybridflow::transport_detail {

struct SharedContent;

struct Message {
  Message() = default;
  Message(std::string kind_, nlohmann::json meta_, std::optional<DataProto> data_,
          std::shared_ptr<SharedContent> shared_ = nullptr)
      : kind(std::move(kind_)), meta(std::move(meta_)), data(std::move(data_)), shared(std::move(shared_)) {}
  std::string kind;
  nlohmann::json meta = nlohmann::json::object();
  std::optional<DataProto> data;
  // Set: send this content instead of kind, meta and data (the same request to many ranks).
  std::shared_ptr<SharedContent> shared;
};

// One message's content for many receivers (a one-to-all call): its frames are encoded, and their MAC
// digests computed (FrameMac::digest_frame), once, on the first send; every receiver still gets its own
// authentication frame, with its own sequence number and a tag under its own one-time key, equal to the
// tag of the same message sent alone. Fill `message` before the first send; it is not read again after.
struct SharedContent {
  explicit SharedContent(Message m) : message(std::move(m)) {}
  Message message;

 private:
  friend class Link;
  const FrameMacKey* digested_with = nullptr;  // the key the digests are for (a link's; null: not encoded)
  std::string meta;                            // message.meta, dumped
  std::optional<DataProto::Frames> data;
  // Per frame: kind, meta, the DataProto header, each payload; a payload's only once a receiver needs it
  // sent inline (empty until then: a digest is never empty, it holds the frame's length).
  std::vector<std::vector<unsigned char>> digests;
};

// The meta key naming a message's shared-memory file (a reply of SharedRowsOffers::offer, whose slots are
// named by payload index); the receiver removes it from the meta it hands on.
inline constexpr const char* kSharedFramesKey = "hf_shared_frames";
// Smaller payloads travel inline: a file costs a few system calls and a mapping.
inline constexpr size_t kSharedFrameMinBytes = size_t(1) << 20;

inline constexpr int kControllerEnd = -1;
inline constexpr size_t kLinkNonceBytes = 16;  // the controller's end of a link; workers are ranks >= 0

// The most bytes one message may have, all frames together (HF_MAX_MESSAGE_BYTES, default 1 GiB; read
// once). Also ZMQ_MAXMSGSIZE on every socket, so ZeroMQ drops a peer sending a bigger frame unread.
size_t max_message_bytes();

// 32 random bytes, hex: the secret of a job whose workers this process spawns.
std::string random_secret();

struct Received {
  std::string identity;         // ROUTER identity frame (empty on a DEALER)
  size_t bytes = 0;             // every frame, as read
  size_t tensor_bytes = 0;      // the DataProto's tensor payloads (among them, or in a shared-memory file)
  std::string peer_address;     // the TCP peer's IP, when ZeroMQ knows it
  int sender = kControllerEnd;  // authenticated sender, valid when message is set
  uint64_t seq = 0;             // its sequence number
  std::optional<Message> message;  // empty when rejected
  std::string reject_code;      // short class of the rejection: oversized, malformed, forged, replayed
  std::string rejected_reason;  // for the log

  // "peer 'ab\x01' at 10.0.0.5": identity and address escaped for a log line.
  std::string who() const;
};

// Bytes a message took on the wire (all frames), and the DataProto's tensor payloads it handed over (among
// those frames, or in a shared-memory file).
struct MessageBytes {
  size_t total = 0;
  size_t tensors = 0;
};

// One end of authenticated conversations on one socket: the controller end (many senders) or a worker
// rank's end. scope separates conversations sharing a secret ("pool:actor", "launch", "data"), so a
// message of one pool cannot be replayed into another.
class Link {
 public:
  // Who may talk to whom: a controller hears only from ranks (>= 0) and a rank only from the controller;
  // between peers (the data plane: workers of any pool, numbered by node) any other node may talk.
  enum class Ends { kControllerAndRanks, kPeers };
  Link(const std::string& secret, std::string scope, int self, Ends ends = Ends::kControllerAndRanks);
  // Sets ZMQ_MAXMSGSIZE: call before bind/connect.
  static void limit(zmq::socket_t& socket);
  // A lower limit than max_message_bytes() for what this end accepts (a data server takes only small
  // requests); also set as the socket's ZMQ_MAXMSGSIZE by the caller.
  void set_max_bytes(size_t bytes) { max_bytes_ = bytes; }
  // identity: the ROUTER frame naming the peer, empty for a DEALER socket; to: the receiver's rank.
  MessageBytes send(zmq::socket_t& socket, const std::string& identity, int to, const Message& message);
  // Receives one multipart message if one is ready (non-blocking); nullopt when none. A DEALER end
  // records the sequence number at once; a ROUTER end only on commit(), after it checked that the
  // message comes from the peer bound to that rank: a stranger holding the key (a second process
  // claiming a taken rank) must not push the genuine rank's numbers out of reach.
  std::optional<Received> receive(zmq::socket_t& socket, bool router);
  // Also closes the shared-memory files (below) of the calls up to the one this message answers.
  void commit(const Received& received);
  const std::string& scope() const { return scope_; }

  // Shared-memory frames (controller end): `rank` said in its hello that it runs on `machine`; when that is
  // this machine (shared_rows_machine) and HF_DISPATCH_SHM is not "0", the big payloads of messages with a
  // "call_id" go to it through a sealed memory file, kept open until the rank's reply to that call (or a
  // later one) commits, the rank is forgotten, or this link ends.
  void set_peer_machine(int rank, const std::string& machine);
  // The rank is gone: its files close, and it gets inline frames from now on.
  void forget_peer(int rank);
  void forget_peers();
  size_t shared_files_open() const { return offers_ ? offers_->open() : 0; }

 private:
  MessageBytes send_shared(zmq::socket_t& socket, const std::string& identity, int to, SharedContent& content);
  // The file for `to`'s copy of `content` (nullopt: send inline), its payloads named by index.
  std::optional<nlohmann::json> offer_shared_frames(int to, uint64_t seq, const SharedContent& content,
                                                    std::vector<bool>& shared);
  std::unique_ptr<FrameMacKey> key_;
  std::array<unsigned char, kLinkNonceBytes> nonce_{};
  std::string scope_;
  int self_;
  Ends ends_;
  size_t max_bytes_;
  uint64_t next_seq_ = 1;
  std::map<int, uint64_t> last_seq_;  // per authenticated sender
  std::set<int> same_machine_;        // ranks that may get shared-memory frames
  std::unique_ptr<SharedRowsOffers> offers_;  // consumer: the rank, request: the message's sequence number
  struct SharedSent {
    int rank;
    int64_t call_id;
    uint64_t seq;
  };
  std::vector<SharedSent> shared_sent_;  // messages whose files are open
};

// Logs a rejected message once per (peer, kind of rejection), so a stranger cannot flood the log; the
// rest are only counted. Remembers at most kMaxKeys pairs, then says so once and logs no new pairs.
class RejectLog {
 public:
  explicit RejectLog(std::string where) : where_(std::move(where)) {}
  // Logs `what` (already escaped) unless this peer had this code before.
  void note(const std::string& peer, const std::string& code, const std::string& what);
  static constexpr size_t kMaxKeys = 256;

 private:
  std::string where_;
  std::set<std::pair<std::string, std::string>> seen_;
  bool full_ = false;
};

}  // namespace hybridflow::transport_detail

namespace hybridflow::transport_detail {
std::string host_name();

// Environment contract between a controller and the worker processes it spawns.
inline constexpr const char* kEndpointEnv = "HF_WORKER_ENDPOINT";
inline constexpr const char* kTokenEnv = "HF_WORKER_TOKEN";
inline constexpr const char* kRankEnv = "HF_WORKER_RANK";
inline constexpr const char* kPoolEnv = "HF_WORKER_POOL";
// The data plane's secret (data_server.h): HF_WORKER_DATA_TOKEN, else the pool's (launched workers: the job's).
inline constexpr const char* kDataTokenEnv = "HF_WORKER_DATA_TOKEN";
inline constexpr double kHeartbeatPeriodS = 0.25;
}  // namespace hybridflow::transport_detail

namespace hybridflow::transport_detail {
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
}  // namespace hybridflow::transport_detail
