#include "data_fetch.h"

#include <torch/torch.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>

#include "data_server.h"
#include "shared_rows.h"
#include "hybridflow/core/error.h"

namespace hybridflow::transport_detail {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

// A producer whose connection was refused or dropped this long, without reconnecting, is gone.
constexpr double kBrokenGraceS = 1.0;

[[noreturn]] void fail_from(const json& source, const std::string& why) {
  HF_FAIL("cannot fetch input rows from role '", source.value("role", "?"), "' rank ", source.value("rank", -1),
          " of pool '", source.value("pool", "?"), "' (pid ", source.value("pid", -1), " on host ",
          source.value("host", "?"), ", data socket ", source.value("endpoint", "?"), "; the output of its method '",
          source.value("method", "?"), "'): ", why);
}

struct Dest {
  c10::ScalarType dtype;
  std::vector<int64_t> shape;  // with the rows first
  torch::Tensor tensor;
  std::vector<bool> covered;
};

void check_like(const torch::Tensor& t, const Dest& d, const std::string& key, int64_t rows, const json& source) {
  if (t.scalar_type() != d.dtype || t.dim() != static_cast<int64_t>(d.shape.size()) || t.size(0) != rows ||
      t.sizes().slice(1) != c10::IntArrayRef(d.shape).slice(1))
    fail_from(source, "tensor '" + key + "' is " + std::string(c10::toString(t.scalar_type())) + " " +
                          c10::str(t.sizes()) + ", not the " + std::string(c10::toString(d.dtype)) + " rows the plan names");
}

}  // namespace

struct InputFetcher::Peer {
  zmq::socket_t dealer;
  zmq::socket_t monitor;
  int node = -1;
  bool shm_unreachable = false;  // its shared-memory files cannot be opened from here: rows come over the socket
  bool broken = false;
  std::string broken_why;
  Clock::time_point broken_since;

  // Connection events: a dead producer's port refuses (CONNECT_RETRIED) or its socket closes (DISCONNECTED).
  void drain_events() {
    zmq::message_t event;
    while (monitor.recv(event, zmq::recv_flags::dontwait)) {
      uint16_t id = 0;
      if (event.size() >= sizeof(id)) std::memcpy(&id, event.data(), sizeof(id));
      zmq::message_t address;
      while (event.more() && monitor.recv(address, zmq::recv_flags::none) && address.more()) {
      }
      if (id == ZMQ_EVENT_CONNECTED) {
        broken = false;
      } else if ((id == ZMQ_EVENT_DISCONNECTED || id == ZMQ_EVENT_CONNECT_RETRIED) && !broken) {
        broken = true;
        broken_since = Clock::now();
        broken_why = id == ZMQ_EVENT_DISCONNECTED ? "the producer closed the connection (its process is gone?)"
                                                  : "the producer's data socket refuses connections (its process is gone?)";
      }
    }
  }
};

InputFetcher::InputFetcher(zmq::context_t& context, const ObjectTable& table) : context_(context), table_(table) {}

InputFetcher::~InputFetcher() {
  for (auto& [endpoint, p] : peers_) zmq_socket_monitor(p->dealer.handle(), nullptr, 0);
}

void InputFetcher::start(const std::string& secret, int node) {
  node_ = node;
  link_ = std::make_unique<Link>(secret, kDataScope, node, Link::Ends::kPeers);
}

InputFetcher::Peer& InputFetcher::peer(const json& source) {
  const std::string endpoint = source.at("endpoint");
  const int node = source.at("node");
  auto it = peers_.find(endpoint);
  if (it != peers_.end() && it->second->node == node) return *it->second;
  if (it != peers_.end()) {
    zmq_socket_monitor(it->second->dealer.handle(), nullptr, 0);
    peers_.erase(it);
  }
  static std::atomic<int> next_monitor{0};
  auto p = std::make_unique<Peer>();
  p->node = node;
  p->dealer = zmq::socket_t(context_, zmq::socket_type::dealer);
  p->dealer.set(zmq::sockopt::linger, 0);
  if (endpoint.find('[') != std::string::npos) p->dealer.set(zmq::sockopt::ipv6, 1);
  Link::limit(p->dealer);
  const std::string monitor = "inproc://hf-data-monitor-" + std::to_string(next_monitor++);
  HF_CHECK(zmq_socket_monitor(p->dealer.handle(), monitor.c_str(),
                              ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CONNECT_RETRIED) == 0,
           "data plane: cannot monitor the connection to ", endpoint, ": ", zmq_strerror(zmq_errno()));
  p->monitor = zmq::socket_t(context_, zmq::socket_type::pair);
  p->monitor.set(zmq::sockopt::linger, 0);
  p->monitor.connect(monitor);
  try {
    p->dealer.connect(endpoint);
  } catch (const zmq::error_t& e) {
    fail_from(source, std::string("cannot connect: ") + e.what());
  }
  return *(peers_[endpoint] = std::move(p));
}

DataProto InputFetcher::assemble(DataProto out, const json& plan, Result* result) {
  HF_CHECK(link_, "data plane: a call with a plan arrived before the controller named this worker's node");
  const int64_t rows = plan.at("rows").get<int64_t>();
  const double timeout_s = plan.value("timeout_s", 60.0);
  std::map<std::string, Dest> dests;
  for (const auto& [key, spec] : plan.at("tensors").items()) {
    Dest d;
    d.dtype = dtype_from_name(spec.at("dtype").get<std::string>());
    d.shape = {rows};
    for (int64_t s : spec.at("shape").get<std::vector<int64_t>>()) d.shape.push_back(s);
    d.covered.assign(static_cast<size_t>(rows), false);
    HF_CHECK(!out.has_tensor(key), "data plane: tensor '", key, "' is both in the call's message and in its plan");
    dests.emplace(key, std::move(d));
  }
  const json& pieces = plan.at("pieces");
  // Every input row of every key exactly once.
  std::map<std::string, std::vector<size_t>> pieces_of;
  for (size_t i = 0; i < pieces.size(); ++i) {
    for (const auto& [key, object_key] : pieces[i].at("keys").items()) {
      auto d = dests.find(key);
      HF_CHECK(d != dests.end(), "data plane: a plan piece names tensor '", key, "', which the plan does not describe");
      pieces_of[key].push_back(i);
      for (const auto& run : pieces[i].at("runs")) {
        const int64_t count = run.at(1), first = run.at(2);
        HF_CHECK(count >= 0 && first >= 0 && first + count <= rows, "data plane: a plan run [", first, ", ",
                 first + count, ") lies outside the input's ", rows, " rows");
        for (int64_t r = first; r < first + count; ++r) {
          HF_CHECK(!d->second.covered[static_cast<size_t>(r)], "data plane: input row ", r, " of '", key,
                   "' is named twice in the plan");
          d->second.covered[static_cast<size_t>(r)] = true;
        }
      }
    }
  }
  for (const auto& [key, d] : dests)
    for (int64_t r = 0; r < rows; ++r)
      HF_CHECK(d.covered[static_cast<size_t>(r)], "data plane: input row ", r, " of '", key, "' is not in the plan");

  // Rows this process keeps: a whole tensor from one object is handed over as a view, the rest copied.
  std::vector<size_t> remote;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const json& piece = pieces[i];
    if (piece.at("source").at("node").get<int>() != node_) {
      remote.push_back(i);
      continue;
    }
    const int64_t object = piece.at("object");
    const json& runs = piece.at("runs");
    for (const auto& [key, object_key] : piece.at("keys").items()) {
      Dest& d = dests.at(key);
      torch::Tensor held;
      try {
        held = table_.get(object, object_key.get<std::string>());
      } catch (const std::exception& e) {
        fail_from(piece.at("source"), e.what());
      }
      if (pieces_of[key].size() == 1 && runs.size() == 1 && runs[0].at(2) == 0 && runs[0].at(1) == rows) {
        const int64_t start = runs[0].at(0);
        HF_CHECK(start >= 0 && start + rows <= held.size(0), "data plane: rows [", start, ", ", start + rows,
                 ") of object ", object, " are outside its ", held.size(0), " rows");
        d.tensor = held.narrow(0, start, rows);
        check_like(d.tensor, d, key, rows, piece.at("source"));
        result->shared.emplace_back(object, object_key.get<std::string>());
        continue;
      }
      if (!d.tensor.defined()) d.tensor = torch::empty(d.shape, torch::TensorOptions().dtype(d.dtype));
      for (const auto& run : runs) {
        const int64_t start = run.at(0), count = run.at(1), first = run.at(2);
        HF_CHECK(start >= 0 && start + count <= held.size(0), "data plane: rows [", start, ", ", start + count,
                 ") of object ", object, " are outside its ", held.size(0), " rows");
        d.tensor.narrow(0, first, count).copy_(held.narrow(0, start, count));
      }
    }
  }
  for (auto& [key, d] : dests)
    if (!d.tensor.defined()) d.tensor = torch::empty(d.shape, torch::TensorOptions().dtype(d.dtype));

  // The other rows, from the producers' data sockets: requests bounded so that each reply fits a message.
  // A producer on this machine answers with a shared-memory file instead (shared_rows.h), when it can.
  struct Request {
    size_t piece;
    std::vector<std::array<int64_t, 3>> runs;
    Peer* peer;
    std::vector<std::string> object_keys;
  };
  std::map<int64_t, Request> outstanding;
  const bool may_share = shared_rows_enabled() && !shared_rows_machine().empty();
  auto issue = [&](Request request) {
    const int64_t id = next_request_++;
    const json& piece = pieces[request.piece];
    json runs = json::array();
    for (const auto& r : request.runs) runs.push_back({r[0], r[1]});
    Message m{"fetch",
              {{"req", id}, {"object", piece.at("object")}, {"keys", request.object_keys}, {"runs", runs}},
              std::nullopt};
    if (may_share && !request.peer->shm_unreachable) {
      m.meta["shm"] = shared_rows_machine();
      m.meta["keep_s"] = timeout_s;
    }
    link_->send(request.peer->dealer, "", request.peer->node, m);
    outstanding.emplace(id, std::move(request));
  };
  const size_t limit = max_message_bytes() / 2;
  for (size_t i : remote) {
    const json& piece = pieces[i];
    const json& source = piece.at("source");
    std::vector<std::string> object_keys;
    size_t row_bytes = 0;
    for (const auto& [key, object_key] : piece.at("keys").items()) {
      object_keys.push_back(object_key);
      const Dest& d = dests.at(key);
      size_t cells = 1;
      for (size_t k = 1; k < d.shape.size(); ++k) cells *= static_cast<size_t>(d.shape[k]);
      row_bytes += cells * c10::elementSize(d.dtype);
    }
    if (row_bytes > limit)
      fail_from(source, "one row is " + std::to_string(row_bytes) + " bytes, more than half of HF_MAX_MESSAGE_BYTES");
    const int64_t max_rows = row_bytes == 0 ? rows + 1 : static_cast<int64_t>(limit / row_bytes);
    Peer& p = peer(source);
    Request current{i, {}, &p, object_keys};
    int64_t in_current = 0;
    auto send = [&] {
      if (current.runs.empty()) return;
      issue(std::move(current));
      current = Request{i, {}, &p, object_keys};
      in_current = 0;
    };
    for (const auto& run : piece.at("runs")) {
      int64_t start = run.at(0), count = run.at(1), first = run.at(2);
      while (count > 0) {
        const int64_t take = std::min(count, max_rows - in_current);
        current.runs.push_back({start, take, first});
        in_current += take;
        start += take;
        first += take;
        count -= take;
        if (in_current == max_rows) send();
      }
    }
    send();
  }
  // An answer's rows of one key where they go: the answer's tensor itself when it is the whole input.
  auto place = [&](const std::string& key, const Request& request, const torch::Tensor& got) {
    Dest& d = dests.at(key);
    if (pieces_of[key].size() == 1 && request.runs.size() == 1 && request.runs[0][2] == 0 &&
        request.runs[0][1] == rows && got.is_contiguous()) {
      d.tensor = got;
      return;
    }
    int64_t offset = 0;
    for (const auto& r : request.runs) {
      d.tensor.narrow(0, r[2], r[1]).copy_(got.narrow(0, offset, r[1]));
      offset += r[1];
    }
  };
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  while (!outstanding.empty()) {
    std::vector<Peer*> waiting;
    for (const auto& kv : outstanding)
      if (std::find(waiting.begin(), waiting.end(), kv.second.peer) == waiting.end()) waiting.push_back(kv.second.peer);
    std::vector<zmq::pollitem_t> items;
    for (Peer* p : waiting) items.push_back({p->dealer.handle(), 0, ZMQ_POLLIN, 0});
    zmq::poll(items.data(), items.size(), std::chrono::milliseconds(100));
    for (Peer* p : waiting) {
      while (auto received = link_->receive(p->dealer, false)) {
        if (!received->message || received->sender != p->node) continue;  // not this producer's answer
        const Message& m = *received->message;
        const int64_t req = m.meta.value("req", int64_t(-1));
        auto it = outstanding.find(req);
        if (it == outstanding.end()) {
          // An answer to a request given up earlier; a file it offers is of no use any more.
          if (m.kind == "rows_shm") link_->send(p->dealer, "", p->node, Message{"release", {{"req", req}}, std::nullopt});
          continue;
        }
        const json& piece = pieces[it->second.piece];
        if (m.kind == "fetch_error") fail_from(piece.at("source"), m.meta.value("message", std::string("?")));
        const bool shared = m.kind == "rows_shm";
        if (!shared && (m.kind != "rows" || !m.data)) fail_from(piece.at("source"), "an unexpected '" + m.kind + "' answer");
        int64_t got = 0;
        for (const auto& r : it->second.runs) got += r[1];
        std::optional<SharedRowsMapping> mapped;
        if (shared) {
          try {
            mapped = SharedRowsMapping::open(m.meta.at("shm"));
          } catch (const std::exception& e) {
            link_->send(p->dealer, "", p->node, Message{"release", {{"req", req}}, std::nullopt});
            fail_from(piece.at("source"), e.what());
          }
          link_->send(p->dealer, "", p->node, Message{"release", {{"req", req}}, std::nullopt});
          if (!mapped) {  // the file cannot be reached from here: this producer answers over its socket from now on
            p->shm_unreachable = true;
            Request again = std::move(it->second);
            outstanding.erase(it);
            issue(std::move(again));
            continue;
          }
        }
        for (const auto& [key, object_key] : piece.at("keys").items()) {
          const Dest& d = dests.at(key);
          const std::string name = object_key;
          torch::Tensor rows_got;
          if (mapped) {
            std::vector<int64_t> shape = d.shape;
            shape[0] = got;
            try {
              rows_got = mapped->tensor(name, d.dtype, shape);
            } catch (const std::exception& e) {
              fail_from(piece.at("source"), e.what());
            }
          } else {
            if (!m.data->has_tensor(name)) fail_from(piece.at("source"), "the answer has no tensor '" + name + "'");
            rows_got = m.data->tensor(name);
          }
          check_like(rows_got, d, name, got, piece.at("source"));
          if (mapped) result->fetched_bytes += rows_got.numel() * rows_got.element_size();
          place(key, it->second, rows_got);
        }
        if (!mapped) result->fetched_bytes += received->tensor_bytes;
        outstanding.erase(it);
      }
    }
    const auto now = Clock::now();
    for (Peer* p : waiting) {
      p->drain_events();
      bool still_waiting = false;
      const json* source = nullptr;
      for (const auto& kv : outstanding)
        if (kv.second.peer == p) {
          still_waiting = true;
          source = &pieces[kv.second.piece].at("source");
        }
      if (still_waiting && p->broken && std::chrono::duration<double>(now - p->broken_since).count() > kBrokenGraceS)
        fail_from(*source, p->broken_why);
    }
    if (!outstanding.empty() && now > deadline)
      fail_from(pieces[outstanding.begin()->second.piece].at("source"),
                "no answer within " + std::to_string(timeout_s) + " s (ResourcePool::data_fetch_timeout_s)");
  }
  for (auto& [key, d] : dests) out.set_tensor(key, std::move(d.tensor));
  return out;
}

}  // namespace hybridflow::transport_detail
