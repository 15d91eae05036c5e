#include "message.h"

#include <torch/torch.h>

#include <memory>

#include "hybridflow/core/error.h"

namespace hybridflow::runtime_detail {
namespace {

zmq::message_t tensor_frame(const torch::Tensor& t) {
  const size_t bytes = t.numel() * t.element_size();
  if (bytes == 0) return zmq::message_t();
  auto* keep = new torch::Tensor(t);
  return zmq::message_t(
      keep->data_ptr(), bytes, [](void*, void* hint) { delete static_cast<torch::Tensor*>(hint); }, keep);
}

zmq::message_t string_frame(const std::string& s) { return zmq::message_t(s.data(), s.size()); }

}  // namespace

void send_message(zmq::socket_t& socket, const std::string& identity, const std::string& token,
                  const Message& message) {
  std::vector<zmq::message_t> frames;
  if (!identity.empty()) frames.push_back(string_frame(identity));
  frames.push_back(string_frame(token));
  frames.push_back(string_frame(message.kind));
  frames.push_back(string_frame(message.meta.dump()));
  if (message.data) {
    auto encoded = message.data->to_frames();
    frames.push_back(string_frame(encoded.header));
    for (const auto& t : encoded.payloads) frames.push_back(tensor_frame(t));
  }
  for (size_t i = 0; i < frames.size(); ++i) {
    auto flags = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
    socket.send(frames[i], flags);
  }
}

std::optional<Received> try_receive(zmq::socket_t& socket, bool router, const std::string& token) {
  std::vector<std::shared_ptr<zmq::message_t>> frames;
  while (true) {
    auto frame = std::make_shared<zmq::message_t>();
    auto got = socket.recv(*frame, frames.empty() ? zmq::recv_flags::dontwait : zmq::recv_flags::none);
    if (!got) return std::nullopt;  // nothing ready
    frames.push_back(frame);
    if (!frame->more()) break;
  }
  Received out;
  size_t i = 0;
  if (router) out.identity = frames[i++]->to_string();
  if (frames.size() < i + 3) {
    out.rejected_reason = "malformed message with " + std::to_string(frames.size()) + " frames";
    return out;
  }
  if (frames[i]->to_string() != token) {
    out.rejected_reason = "wrong job token";
    return out;
  }
  Message m;
  m.kind = frames[i + 1]->to_string();
  try {
    m.meta = nlohmann::json::parse(frames[i + 2]->to_string());
    i += 3;
    if (i < frames.size()) {
      std::string header = frames[i++]->to_string();
      std::vector<Buffer> payloads;
      for (; i < frames.size(); ++i) payloads.push_back(Buffer{frames[i]->data(), frames[i]->size(), frames[i]});
      m.data = DataProto::from_frames(header, payloads);
    }
  } catch (const std::exception& e) {
    out.rejected_reason = std::string("undecodable message: ") + e.what();
    return out;
  }
  out.message = std::move(m);
  return out;
}

}  // namespace hybridflow::runtime_detail

#include <unistd.h>

namespace hybridflow::runtime_detail {

nlohmann::json coord_to_json(const MeshCoord& c) {
  return {{"rank", c.rank}, {"world_size", c.world_size}, {"dp", c.dp}, {"dp_size", c.dp_size},
          {"tp", c.tp}, {"tp_size", c.tp_size}, {"pp", c.pp}, {"pp_size", c.pp_size},
          {"micro_dp", c.micro_dp}, {"micro_dp_size", c.micro_dp_size}, {"micro_dp_local", c.micro_dp_local}};
}

MeshCoord coord_from_json(const nlohmann::json& j) {
  MeshCoord c;
  c.rank = j.at("rank");
  c.world_size = j.at("world_size");
  c.dp = j.at("dp");
  c.dp_size = j.at("dp_size");
  c.tp = j.at("tp");
  c.tp_size = j.at("tp_size");
  c.pp = j.at("pp");
  c.pp_size = j.at("pp_size");
  c.micro_dp = j.at("micro_dp");
  c.micro_dp_size = j.at("micro_dp_size");
  c.micro_dp_local = j.at("micro_dp_local");
  return c;
}

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

}  // namespace hybridflow::runtime_detail

#include <fcntl.h>

namespace hybridflow::runtime_detail {

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

}  // namespace hybridflow::runtime_detail
