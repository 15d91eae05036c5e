// Controller side of a launch: answers every worker rank's join ping with "wait", its pool assignment
// or its release. Answers only come on pings, so a rank that is not yet up simply learns its fate
// when it asks, and a rank that stops hearing answers knows the controller is gone.
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "hybridflow/core/error.h"
#include "hybridflow/core/logging.h"
#include "hybridflow/core/printable.h"
#include "launcher_detail.h"

namespace hybridflow::transport_detail {
namespace {

using Clock = std::chrono::steady_clock;

constexpr double kDefaultHeartbeatTimeoutS = 30;
constexpr double kReleaseGraceS = 5;

std::string join_ranks(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out.empty() ? "(none)" : out;
}

}  // namespace

Rendezvous::Rendezvous(const LaunchSettings& settings)
    : settings_(settings), link_(settings.token, "launch", kControllerEnd) {
  ranks_.resize(settings_.env.world_size);
  for (int r = 0; r < settings_.env.world_size; ++r)
    if (r != settings_.controller_rank) free_ranks_.push_back(r);
  router_.set(zmq::sockopt::linger, 1000);  // a release still queued at exit gets out
  Link::limit(router_);
  const std::string listen = "tcp://" + settings_.bind_addr + ":" + std::to_string(settings_.rendezvous_port);
  try {
    router_.bind(listen);
  } catch (const zmq::error_t& e) {
    HF_FAIL("launch controller (", settings_.env.launcher, " rank ", settings_.env.rank, "): cannot listen on ", listen,
            " for the worker ranks: ", e.what(), " (the address comes from HF_BIND_ADDR or MASTER_ADDR, which must "
            "name this host; the port from HF_RENDEZVOUS_PORT or MASTER_PORT)");
  }
  log_info("launch controller: rank ", settings_.env.rank, " of ", settings_.env.world_size, " (",
           settings_.env.launcher, ") waits for worker ranks on ", listen, " (job secret from ", settings_.token_source, ")");
  io_ = std::thread([this] { loop(); });
}

Rendezvous::~Rendezvous() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify();
  if (io_.joinable()) io_.join();
}

void Rendezvous::reserve(const std::vector<std::pair<std::string, int>>& pools) {
  std::lock_guard<std::mutex> lock(mutex_);
  int needed = 0;
  std::string sizes;
  for (const auto& [name, n] : pools) {
    needed += n;
    sizes += (sizes.empty() ? "" : " + ") + name + " (" + std::to_string(n) + ")";
  }
  const int workers = settings_.env.world_size - 1;
  HF_CHECK(needed <= static_cast<int>(free_ranks_.size()), "resource pools ", sizes, " need ", needed,
           " worker processes, but the ", settings_.env.launcher, " launch has ", free_ranks_.size(),
           " worker ranks left (world_size ", settings_.env.world_size, " minus the controller = ", workers, ", ",
           workers - static_cast<int>(free_ranks_.size()),
           " already serving pools): launch with world_size = 1 + the sum of the pool sizes");
  for (const auto& [name, n] : pools) {
    HF_CHECK(!reserved_.count(name), "resource pool '", name, "' already claimed launcher ranks");
    std::vector<int> ranks(free_ranks_.begin(), free_ranks_.begin() + n);
    free_ranks_.erase(free_ranks_.begin(), free_ranks_.begin() + n);
    log_info("launch controller: resource pool '", name, "' <- launcher ranks ", join_ranks(ranks));
    reserved_[name] = std::move(ranks);
  }
}

Rendezvous::Claim Rendezvous::claim(const ResourcePool& spec) {
  bool reserved;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    reserved = reserved_.count(spec.name) > 0;
  }
  if (!reserved) reserve({{spec.name, spec.num_processes}});
  Claim out;
  out.spec = spec;
  std::lock_guard<std::mutex> lock(mutex_);
  out.ranks = std::move(reserved_.at(spec.name));
  reserved_.erase(spec.name);
  HF_CHECK(static_cast<int>(out.ranks.size()) == spec.num_processes, "resource pool '", spec.name, "' reserved ",
           out.ranks.size(), " launcher ranks but starts with num_processes = ", spec.num_processes);
  out.spec.spawn_workers = false;
  out.spec.token = settings_.token;
  out.spec.data_token = settings_.token;  // launched workers know only the job secret
  out.spec.bind_host = settings_.bind_addr;
  if (settings_.pool_port_base > 0 && spec.bind_port == 0) out.spec.bind_port = settings_.pool_port_base + pools_listening_;
  ++pools_listening_;
  if (settings_.heartbeat_timeout_s > 0) out.spec.heartbeat_timeout_s = settings_.heartbeat_timeout_s;
  return out;
}

void Rendezvous::hand_out(const ResourcePool& spec, const std::vector<int>& ranks, int port) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < ranks.size(); ++i) {
      RankState& r = ranks_[ranks[i]];
      nlohmann::json env = nlohmann::json::object();
      for (const auto& kv : spec.env) {
        if (!pool_env_key_allowed(kv.first)) {
          if (i == 0) log_warn("launch controller: resource pool '", spec.name, "': worker environment key ", kv.first,
                               " is not applied by launched workers (only thread counts and device selection are; "
                               "docs/security.md); set it in the launcher's environment instead");
          continue;
        }
        env[kv.first] = kv.second;
      }
      r.answer = Message{"assign",
                         {{"pool", spec.name},
                          {"pool_rank", static_cast<int>(i)},
                          {"endpoint", settings_.endpoint(port)},
                          {"env", env}},
                         std::nullopt};
      r.final_answer = true;
    }
  }
  wake_.notify();
}

void Rendezvous::release_unclaimed() {
  std::vector<int> idle, failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
      if (r == settings_.controller_rank) continue;
      RankState& s = ranks_[r];
      if (s.final_answer && s.delivered) continue;
      // Claimed but never told where to go: its pool did not start, so the job failed.
      const bool claimed = s.final_answer;
      (claimed ? failed : idle).push_back(r);
      s.answer = Message{"release", {{"exit_code", claimed ? 1 : 0}}, std::nullopt};
      s.final_answer = true;
    }
  }
  // Plain stderr: at exit the logger may already be destroyed.
  if (!idle.empty())
    std::fprintf(stderr, "hybridflow launch: launcher ranks %s served no resource pool (the pools used %d of %d "
                 "worker ranks); releasing them\n", join_ranks(idle).c_str(),
                 settings_.env.world_size - 1 - static_cast<int>(idle.size() + failed.size()),
                 settings_.env.world_size - 1);
  const auto deadline = Clock::now() + std::chrono::duration<double>(kReleaseGraceS);
  while (Clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      bool all = true;
      for (int r : idle) all = all && ranks_[r].delivered;
      for (int r : failed) all = all && ranks_[r].delivered;
      if (all) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Closing the context waits (up to the linger time) until the queued releases are on the wire.
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify();
  if (io_.joinable()) io_.join();
  router_.close();
  context_.close();
}

void Rendezvous::loop() {
  const double limit = settings_.heartbeat_timeout_s > 0 ? settings_.heartbeat_timeout_s : kDefaultHeartbeatTimeoutS;
  while (true) {
    zmq::pollitem_t items[] = {{router_.handle(), 0, ZMQ_POLLIN, 0}, {nullptr, wake_.fd(), ZMQ_POLLIN, 0}};
    zmq::poll(items, 2, std::chrono::milliseconds(100));
    wake_.drain();
    while (auto received = link_.receive(router_, true)) {
      if (!received->message) {
        reject(*received, received->reject_code, received->rejected_reason);
        continue;
      }
      const Message& m = *received->message;
      // The rank is the authenticated sender; only the worker ranks of this launch may join.
      const int rank = received->sender;
      if (rank >= settings_.env.world_size || rank == settings_.controller_rank) {
        reject(*received, "unknown-rank",
               detail::concat("rank ", rank, " is not a worker rank of this launch (world_size ",
                              settings_.env.world_size, ", controller rank ", settings_.controller_rank, ")"));
        continue;
      }
      if (m.kind != "join") {
        reject(*received, "unexpected", "unexpected '" + printable(m.kind, 32) + "' from rank " + std::to_string(rank));
        continue;
      }
      Message reply;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        RankState& r = ranks_[rank];
        if (!r.joined) {
          r.joined = true;
          r.identity = received->identity;
          r.host = printable(m.meta.value("host", "?"), 64);
          log_debug("launch controller: rank ", rank, " joined from host ", r.host, " (", received->who(), ")");
        } else if (r.identity != received->identity) {
          reject(*received, "taken-rank",
                 detail::concat("rank ", rank, " already joined from host ", r.host,
                                "; a second joiner for it is refused"));
          continue;
        }
        link_.commit(*received);
        const int world = m.meta.value("world_size", -1);
        if (world != settings_.env.world_size) {
          reply = Message{"refuse",
                          {{"message", detail::concat("rank ", rank, " has world_size ", world, " but the controller (",
                                                      settings_.env.launcher, " rank ", settings_.env.rank,
                                                      ") has ", settings_.env.world_size)}},
                          std::nullopt};
        } else {
          reply = r.answer;
          reply.meta["heartbeat_timeout_s"] = limit;
          if (r.final_answer) r.delivered = true;
        }
      }
      link_.send(router_, received->identity, rank, reply);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) break;
  }
}

void Rendezvous::reject(const Received& received, const std::string& code, const std::string& why) {
  ++rejected_;
  // Per connection: a stranger opening many connections is capped by RejectLog::kMaxKeys.
  const std::string& peer = received.identity;
  reject_log_.note(peer, code, "rejected a message from " + received.who() + ": " + why);
}

Rendezvous* launch_rendezvous() {
  static std::once_flag once;
  static Rendezvous* instance = nullptr;
  std::call_once(once, [] {
    const LaunchSettings& s = launch_settings();
    if (!s.multi_rank() || !s.is_controller()) return;
    // Never destroyed: pools of static objects may still use it; the atexit hook releases the ranks.
    instance = new Rendezvous(s);
    std::atexit([] { instance->release_unclaimed(); });
  });
  return instance;
}

}  // namespace hybridflow::transport_detail
