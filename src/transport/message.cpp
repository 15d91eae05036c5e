#include "message.h"

#include <sodium.h>
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "hybridflow/core/error.h"
#include "hybridflow/core/logging.h"
#include "hybridflow/core/printable.h"

namespace hybridflow::transport_detail {
namespace {

constexpr char kMagic[4] = {'H', 'F', 'm', '2'};
// magic | sender | sequence number | the sending link's nonce | tag
constexpr size_t kAuthBytes = 4 + 4 + 8 + kLinkNonceBytes + kFrameTagBytes;
constexpr size_t kTagOffset = 4 + 4 + 8 + kLinkNonceBytes;
// DataProto tensors are few (a dozen fields); far more frames is a peer trying to exhaust memory.
constexpr size_t kMaxFrames = 4096;

zmq::message_t tensor_frame(const torch::Tensor& t) {
  const size_t bytes = t.numel() * t.element_size();
  if (bytes == 0) return zmq::message_t();
  auto* keep = new torch::Tensor(t);
  return zmq::message_t(
      keep->data_ptr(), bytes, [](void*, void* hint) { delete static_cast<torch::Tensor*>(hint); }, keep);
}

zmq::message_t string_frame(const std::string& s) { return zmq::message_t(s.data(), s.size()); }

void put_u64(unsigned char* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint64_t get_u64(const unsigned char* in) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | in[i];
  return v;
}
void put_i32(unsigned char* out, int32_t v) {
  const auto u = static_cast<uint32_t>(v);
  for (int i = 0; i < 4; ++i) out[i] = static_cast<unsigned char>(u >> (8 * i));
}
int32_t get_i32(const unsigned char* in) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | in[i];
  return static_cast<int32_t>(v);
}

void ensure_sodium() {
  static const bool ok = sodium_init() >= 0;
  HF_CHECK(ok, "libsodium failed to initialise (sodium_init); messages cannot be authenticated");
}

// What names a message's place in its conversation: who talks to whom in which scope, the sequence number
// and the sending link's nonce. The one-time key of its MAC is derived from these.
std::vector<unsigned char> mac_header(const std::string& scope, int sender, int receiver, uint64_t seq,
                                      const unsigned char* nonce) {
  std::vector<unsigned char> header(4 + 8 + scope.size() + 4 + 4 + 8 + kLinkNonceBytes);
  unsigned char* at = header.data();
  std::memcpy(at, kMagic, 4);
  put_u64(at + 4, scope.size());
  std::memcpy(at + 12, scope.data(), scope.size());
  at += 12 + scope.size();
  put_i32(at, sender);
  put_i32(at + 4, receiver);
  put_u64(at + 8, seq);
  std::memcpy(at + 16, nonce, kLinkNonceBytes);
  return header;
}

// The tag over the header above and every content frame (frame_mac.h: each frame's length goes in with
// it, so boundaries cannot shift).
template <typename Frames>
void compute_mac(const FrameMacKey& key, const std::string& scope, int sender, int receiver, uint64_t seq,
                 const unsigned char* nonce, const Frames& frames, size_t first, unsigned char* tag) {
  const auto header = mac_header(scope, sender, receiver, seq, nonce);
  FrameMac mac(key, header.data(), header.size());
  for (size_t i = first; i < frames.size(); ++i) mac.add_frame(frames[i]->data(), frames[i]->size());
  mac.finish(tag);
}

std::string peer_address_of(zmq::message_t& frame) {
  try {
    return frame.gets("Peer-Address");
  } catch (const zmq::error_t&) {
    return "";  // not a TCP peer, or libzmq too old
  }
}

}  // namespace

size_t max_message_bytes() {
  static const size_t limit = [] {
    const char* text = std::getenv("HF_MAX_MESSAGE_BYTES");
    if (text == nullptr || *text == '\0') return size_t(1) << 30;
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(text, &end, 10);
    HF_CHECK(end != text && *end == '\0' && errno == 0 && v >= 4096 && v <= (1ull << 62),
             "HF_MAX_MESSAGE_BYTES=", text, " must be a number of bytes >= 4096");
    return static_cast<size_t>(v);
  }();
  return limit;
}

std::string random_secret() {
  ensure_sodium();
  unsigned char bytes[32];
  randombytes_buf(bytes, sizeof(bytes));
  char hex[2 * sizeof(bytes) + 1];
  sodium_bin2hex(hex, sizeof(hex), bytes, sizeof(bytes));
  return hex;
}

std::string Received::who() const {
  std::string out = "peer '" + printable(identity, 64) + "'";
  if (!peer_address.empty()) out += " at " + printable(peer_address, 64);
  return out;
}

Link::Link(const std::string& secret, std::string scope, int self, Ends ends)
    : scope_(std::move(scope)), self_(self), ends_(ends), max_bytes_(max_message_bytes()) {
  ensure_sodium();
  HF_CHECK(!secret.empty(), "message link '", scope_, "': empty job secret");
  key_ = std::make_unique<FrameMacKey>(secret);
  // Fresh for every link: a sender's (scope, sequence number) pairs never repeat under one one-time key,
  // not even across jobs that share a secret or a rank whose link is made again.
  randombytes_buf(nonce_.data(), nonce_.size());
}

void Link::limit(zmq::socket_t& socket) {
  socket.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(max_message_bytes()));
}

MessageBytes Link::send(zmq::socket_t& socket, const std::string& identity, int to, const Message& message) {
  if (message.shared) return send_shared(socket, identity, to, *message.shared);
  // A message of its own is content shared with one receiver: one way to encode and authenticate.
  SharedContent alone(Message{message.kind, message.meta, message.data, nullptr});
  return send_shared(socket, identity, to, alone);
}

MessageBytes Link::send_shared(zmq::socket_t& socket, const std::string& identity, int to, SharedContent& content) {
  auto digest = [this](const void* data, size_t size) {
    std::vector<unsigned char> d;
    FrameMac::digest_frame(*key_, data, size, d);
    return d;
  };
  auto payload_bytes = [](const torch::Tensor& t) { return t.numel() * t.element_size(); };
  if (content.digested_with != key_.get()) {  // the first receiver: encode and digest for all
    const Message& m = content.message;
    content.meta = m.meta.dump();
    content.data.reset();
    content.digests.clear();
    content.digests.push_back(digest(m.kind.data(), m.kind.size()));
    content.digests.push_back(digest(content.meta.data(), content.meta.size()));
    if (m.data) {
      content.data = m.data->to_frames();
      content.digests.push_back(digest(content.data->header.data(), content.data->header.size()));
      content.digests.resize(3 + content.data->payloads.size());  // payloads: when first sent inline
    }
    content.digested_with = key_.get();
  }
  const uint64_t seq = next_seq_++;
  std::vector<bool> shared;  // per payload: in the shared-memory file
  const auto file = offer_shared_frames(to, seq, content, shared);
  const std::string meta_with_file = file ? [&] {
    nlohmann::json meta = content.message.meta;
    meta[kSharedFramesKey] = *file;
    return meta.dump();
  }() : std::string();

  std::vector<std::unique_ptr<zmq::message_t>> frames;
  if (!identity.empty()) frames.push_back(std::make_unique<zmq::message_t>(string_frame(identity)));
  const size_t auth_index = frames.size();
  frames.push_back(std::make_unique<zmq::message_t>(kAuthBytes));
  frames.push_back(std::make_unique<zmq::message_t>(string_frame(content.message.kind)));
  frames.push_back(std::make_unique<zmq::message_t>(string_frame(file ? meta_with_file : content.meta)));
  size_t handed_over = 0;  // tensor bytes in the file
  const auto header = mac_header(scope_, self_, to, seq, nonce_.data());
  FrameMac mac(*key_, header.data(), header.size());
  mac.add_digests(content.digests[0].data(), content.digests[0].size());
  if (file) {
    const auto d = digest(meta_with_file.data(), meta_with_file.size());
    mac.add_digests(d.data(), d.size());
  } else {
    mac.add_digests(content.digests[1].data(), content.digests[1].size());
  }
  if (content.data) {
    frames.push_back(std::make_unique<zmq::message_t>(string_frame(content.data->header)));
    mac.add_digests(content.digests[2].data(), content.digests[2].size());
    for (size_t k = 0; k < content.data->payloads.size(); ++k) {
      const torch::Tensor& t = content.data->payloads[k];
      if (file && shared[k]) {  // in the file: an empty frame
        frames.push_back(std::make_unique<zmq::message_t>());
        handed_over += payload_bytes(t);
        const auto d = digest(nullptr, 0);
        mac.add_digests(d.data(), d.size());
        continue;
      }
      auto& d = content.digests[3 + k];
      if (d.empty()) d = digest(t.numel() == 0 ? nullptr : t.data_ptr(), payload_bytes(t));
      frames.push_back(std::make_unique<zmq::message_t>(tensor_frame(t)));
      mac.add_digests(d.data(), d.size());
    }
  }
  auto* auth = static_cast<unsigned char*>(frames[auth_index]->data());
  std::memcpy(auth, kMagic, 4);
  put_i32(auth + 4, self_);
  put_u64(auth + 8, seq);
  std::memcpy(auth + 16, nonce_.data(), nonce_.size());
  mac.finish(auth + kTagOffset);
  MessageBytes bytes{0, handed_over};
  const size_t first_payload = auth_index + 4;  // after auth, kind, meta and the DataProto header
  for (size_t i = 0; i < frames.size(); ++i) {
    bytes.total += frames[i]->size();
    if (content.data && i >= first_payload) bytes.tensors += frames[i]->size();
    socket.send(*frames[i], i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  return bytes;
}

std::optional<nlohmann::json> Link::offer_shared_frames(int to, uint64_t seq, const SharedContent& content,
                                                        std::vector<bool>& shared) {
  const nlohmann::json& meta = content.message.meta;
  if (!content.data || !same_machine_.count(to) || !shared_frames_enabled()) return std::nullopt;
  auto call = meta.find("call_id");
  if (call == meta.end() || !call->is_number_integer()) return std::nullopt;  // nothing would release the file
  std::vector<SharedRowsPart> parts;
  shared.assign(content.data->payloads.size(), false);
  for (size_t k = 0; k < content.data->payloads.size(); ++k) {
    const torch::Tensor& t = content.data->payloads[k];
    if (static_cast<size_t>(t.numel()) * t.element_size() < kSharedFrameMinBytes) continue;
    shared[k] = true;
    parts.push_back({std::to_string(k), t});
  }
  if (parts.empty()) return std::nullopt;
  if (!offers_) offers_ = std::make_unique<SharedRowsOffers>();
  offers_->expire();
  // A bound for a rank that neither answers nor dies (the pool's call timeout fails it much earlier).
  constexpr double kKeepS = 24 * 3600;
  auto file = offers_->offer(to, static_cast<int64_t>(seq), parts, kKeepS);
  if (file) shared_sent_.push_back({to, call->get<int64_t>(), seq});
  return file;
}

void Link::set_peer_machine(int rank, const std::string& machine) {
  if (!machine.empty() && machine == shared_rows_machine())
    same_machine_.insert(rank);
  else
    same_machine_.erase(rank);
}

void Link::forget_peers() {
  same_machine_.clear();
  shared_sent_.clear();
  offers_.reset();  // closes every file
}

void Link::forget_peer(int rank) {
  same_machine_.erase(rank);
  for (size_t i = shared_sent_.size(); i-- > 0;) {
    if (shared_sent_[i].rank != rank) continue;
    offers_->release(rank, static_cast<int64_t>(shared_sent_[i].seq));
    shared_sent_.erase(shared_sent_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

std::optional<Received> Link::receive(zmq::socket_t& socket, bool router) {
  std::vector<std::shared_ptr<zmq::message_t>> frames;
  Received out;
  size_t total = 0, count = 0;
  bool oversized = false;
  while (true) {
    auto frame = std::make_shared<zmq::message_t>();
    auto got = socket.recv(*frame, count == 0 ? zmq::recv_flags::dontwait : zmq::recv_flags::none);
    if (!got) {
      if (count == 0) return std::nullopt;  // nothing ready
      break;
    }
    // The ROUTER's identity frame is made locally and carries no peer metadata; the wire frames do.
    if (out.peer_address.empty() && !(router && count == 0)) out.peer_address = peer_address_of(*frame);
    ++count;
    total += frame->size();
    const bool more = frame->more();
    // Past the limit the rest is read and dropped at once, never kept: the size is known before decoding.
    if (total > max_bytes_ || count > kMaxFrames) oversized = true;
    if (!oversized || (router && count == 1)) frames.push_back(std::move(frame));
    if (!more) break;
  }
  size_t i = 0;
  out.bytes = total;
  if (router && !frames.empty()) out.identity = frames[i++]->to_string();
  if (oversized) {
    out.reject_code = "oversized";
    out.rejected_reason = detail::concat("oversized message (", count, " frames, at least ", total,
                                         " bytes; the limit is ", max_bytes_, " bytes in at most ",
                                         kMaxFrames, " frames, HF_MAX_MESSAGE_BYTES)");
    return out;
  }
  if (frames.size() < i + 3 || frames[i]->size() != kAuthBytes ||
      std::memcmp(frames[i]->data(), kMagic, 4) != 0) {
    out.reject_code = "malformed";
    out.rejected_reason = detail::concat("malformed message (", frames.size() - i,
                                         " frames, no hybridflow authentication frame)");
    return out;
  }
  const auto* auth = static_cast<const unsigned char*>(frames[i]->data());
  const int sender = get_i32(auth + 4);
  const uint64_t seq = get_u64(auth + 8);
  unsigned char tag[kFrameTagBytes];
  compute_mac(*key_, scope_, sender, self_, seq, auth + 16, frames, i + 1, tag);
  // A controller hears only from ranks, a rank only from the controller; a peer from any other node.
  const bool sender_ok = ends_ == Ends::kPeers         ? sender >= 0 && sender != self_
                         : self_ == kControllerEnd ? sender >= 0
                                                   : sender == kControllerEnd;
  if (!sender_ok || crypto_verify_16(tag, auth + kTagOffset) != 0) {
    out.reject_code = "forged";
    out.rejected_reason = "message not authenticated for '" + printable(scope_) +
                          "' (another job's secret, or forged)";
    return out;
  }
  auto last = last_seq_.find(sender);
  if (last != last_seq_.end() && seq <= last->second) {
    out.reject_code = "replayed";
    out.rejected_reason = detail::concat("replayed message (sequence number ", seq, " from ",
                                         sender == kControllerEnd ? std::string("the controller")
                                                                  : "rank " + std::to_string(sender),
                                         ", already at ", last->second, ")");
    return out;
  }
  out.sender = sender;
  out.seq = seq;
  if (!router) last_seq_[sender] = seq;
  Message m;
  m.kind = frames[i + 1]->to_string();
  std::optional<SharedRowsMapping> file;
  try {
    m.meta = nlohmann::json::parse(frames[i + 2]->to_string());
    if (auto named = m.meta.find(kSharedFramesKey); named != m.meta.end()) {
      try {
        file = SharedRowsMapping::open(*named);
      } catch (const std::exception& e) {
        out.reject_code = "refused-file";
        out.rejected_reason = "the shared-memory file of its tensors is refused: " + printable(e.what());
        return out;
      }
      if (!file) {
        out.reject_code = "unreachable-file";
        out.rejected_reason = "the shared-memory file of its tensors cannot be opened from this process "
                              "(/proc of the sender hidden, or another pid namespace; HF_DISPATCH_SHM=0 avoids it)";
        return out;
      }
      m.meta.erase(named);
    }
    i += 3;
    if (i < frames.size()) {
      std::string header = frames[i++]->to_string();
      std::vector<Buffer> payloads;
      for (; i < frames.size(); ++i) {
        out.tensor_bytes += frames[i]->size();
        auto mapped = file ? file->slot(std::to_string(payloads.size())) : std::nullopt;
        if (mapped) {
          HF_CHECK(frames[i]->size() == 0, "payload ", payloads.size(), " is both in the shared-memory file and sent");
          out.tensor_bytes += mapped->size;
          payloads.push_back(std::move(*mapped));
        } else {
          payloads.push_back(Buffer{frames[i]->data(), frames[i]->size(), frames[i]});
        }
      }
      m.data = DataProto::from_frames(header, payloads);
    }
  } catch (const std::exception& e) {
    out.reject_code = "malformed";
    out.rejected_reason = "undecodable message: " + printable(e.what());
    return out;
  }
  out.message = std::move(m);
  return out;
}

void Link::commit(const Received& received) {
  if (!received.message) return;
  last_seq_[received.sender] = received.seq;
  if (shared_sent_.empty()) return;
  // A reply to a call means the rank has decoded that call's message, and (one socket, one thread decoding
  // in order) every message sent to it before: their files are mapped, or no longer needed.
  auto call = received.message->meta.find("call_id");
  if (call == received.message->meta.end() || !call->is_number_integer()) return;
  const int64_t id = call->get<int64_t>();
  uint64_t upto = 0;
  for (const auto& s : shared_sent_)
    if (s.rank == received.sender && s.call_id == id) upto = std::max(upto, s.seq);
  for (size_t i = shared_sent_.size(); i-- > 0;) {
    const SharedSent& s = shared_sent_[i];
    if (s.rank != received.sender || s.seq > upto) continue;
    offers_->release(s.rank, static_cast<int64_t>(s.seq));
    shared_sent_.erase(shared_sent_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

void RejectLog::note(const std::string& peer, const std::string& code, const std::string& what) {
  if (seen_.count({peer, code})) return;
  if (seen_.size() >= kMaxKeys) {
    if (!full_) log_warn(where_, ": more than ", kMaxKeys, " peers sent rejected messages; further ones are "
                         "counted, not logged");
    full_ = true;
    return;
  }
  seen_.insert({peer, code});
  log_warn(where_, ": ", what, " (further '", code, "' rejections from this peer are counted, not logged)");
}

}  // namespace hybridflow::transport_detail

#include <unistd.h>

namespace hybridflow::transport_detail {

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

}  // namespace hybridflow::transport_detail

#include <fcntl.h>

namespace hybridflow::transport_detail {

WakePipe::WakePipe() {
  HF_CHECK(::pipe(fds_) == 0, "cannot create a pipe for the runtime I/O thread");
  for (int fd : fds_) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  for (int fd : fds_) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
}

WakePipe::~WakePipe() {
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
}

void WakePipe::notify() {
  char b = 1;
  [[maybe_unused]] auto n = ::write(fds_[1], &b, 1);  // a full pipe already means "wake up"
}

void WakePipe::drain() {
  char buf[64];
  while (::read(fds_[0], buf, sizeof(buf)) > 0) {
  }
}

}  // namespace hybridflow::transport_detail
