#include "data_server.h"

#include <algorithm>

#include "hybridflow/core/error.h"
#include "hybridflow/core/printable.h"

namespace hybridflow::transport_detail {

DataServer::DataServer(zmq::context_t& context, const std::string& host, const ObjectTable& table, std::string where)
    : table_(table), socket_(context, zmq::socket_type::router), rejects_(std::move(where)) {
  socket_.set(zmq::sockopt::linger, 0);
  socket_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(kMaxRequestBytes));
  // A host name or IPv6 address as ZeroMQ wants it.
  const std::string bind = "tcp://" + (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":*";
  if (host.find(':') != std::string::npos) socket_.set(zmq::sockopt::ipv6, 1);
  try {
    socket_.bind(bind);
  } catch (const zmq::error_t& e) {
    HF_FAIL("data socket: cannot listen on ", bind, ": ", e.what());
  }
  endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
}

void DataServer::start(const std::string& secret, int node) {
  link_ = std::make_unique<Link>(secret, kDataScope, node, Link::Ends::kPeers);
  link_->set_max_bytes(kMaxRequestBytes);
}

void DataServer::serve() {
  shared_.expire();
  if (!link_) {  // not started: nobody may fetch yet
    zmq::message_t frame;
    while (socket_.recv(frame, zmq::recv_flags::dontwait)) {
      while (frame.more() && socket_.recv(frame, zmq::recv_flags::none)) {
      }
    }
    return;
  }
  while (auto received = link_->receive(socket_, true)) {
    if (!received->message) {
      ++rejected_;
      rejects_.note(received->identity, received->reject_code,
                    "rejected a data request from " + received->who() + ": " + received->rejected_reason);
      continue;
    }
    link_->commit(*received);
    const Message& m = *received->message;
    if (m.kind == "release") {  // a consumer mapped the file of a shared-memory answer
      shared_.release(received->sender, m.meta.value("req", int64_t(-1)));
      continue;
    }
    if (m.kind != "fetch") {
      ++rejected_;
      rejects_.note(received->identity, "unexpected", "rejected a '" + printable(m.kind, 32) + "' message from " +
                                                          received->who() + " on the data socket");
      continue;
    }
    const int64_t req = m.meta.value("req", int64_t(-1));
    Message reply{"rows", {{"req", req}}, std::nullopt};
    try {
      RowRuns runs;
      for (const auto& r : m.meta.at("runs")) runs.emplace_back(r.at(0).get<int64_t>(), r.at(1).get<int64_t>());
      const int64_t object = m.meta.at("object").get<int64_t>();
      const auto keys = m.meta.at("keys").get<std::vector<std::string>>();
      // A consumer on this machine (same boot and pid namespace) maps the rows instead of receiving them.
      std::optional<nlohmann::json> offered;
      if (m.meta.value("shm", std::string()) == shared_rows_machine() && !shared_rows_machine().empty()) {
        std::vector<SharedRowsPart> parts;
        for (auto& [key, views] : table_.row_views(object, keys, runs))
          for (auto& v : views) parts.push_back({key, std::move(v)});
        offered = shared_.offer(received->sender, req, parts, std::clamp(m.meta.value("keep_s", 60.0), 1.0, 3600.0));
      }
      if (offered) {
        reply.kind = "rows_shm";
        reply.meta["shm"] = std::move(*offered);
      } else {
        reply.data = table_.rows(object, keys, runs);
      }
    } catch (const std::exception& e) {
      reply.kind = "fetch_error";
      reply.meta["message"] = e.what();
    }
    link_->send(socket_, received->identity, received->sender, reply);
  }
}

}  // namespace hybridflow::transport_detail
