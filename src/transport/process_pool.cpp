#include "hybridflow/transport/process_pool.h"

#include <algorithm>
#include <future>

#include "hybridflow/core/error.h"
#include "hybridflow/core/logging.h"
#include "launcher_detail.h"
#include "pool_impl.h"

namespace hybridflow {
namespace {

// Pools of this process, numbered: a worker's node on the data plane is pool index << 16 | rank.
std::atomic<int> g_next_pool_index{1};

// Whether two ranks' inputs are one and the same (a one-to-all call's copies share their tensors): then
// the request is encoded and its frames digested once for every rank (transport_detail::SharedContent).
bool same_rank_input(const ProcessPool::RankInput& a, const ProcessPool::RankInput& b) {
  if (a.plan != b.plan || a.data.meta() != b.data.meta() || a.data.fields() != b.data.fields()) return false;
  const auto& x = a.data.tensors();
  const auto& y = b.data.tensors();
  if (x.size() != y.size()) return false;
  for (auto i = x.begin(), j = y.begin(); i != x.end(); ++i, ++j)
    if (i->first != j->first || !i->second.is_same(j->second)) return false;
  return true;
}

}  // namespace

using transport_detail::kMaxPoolRanks;
using Clock = transport_detail::PoolClock;
using transport_detail::Message;
using transport_detail::Pending;
using transport_detail::RankState;
using transport_detail::install_signal_handlers;
using transport_detail::unregister_pgid;

ProcessPool::ProcessPool(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::shared_ptr<ProcessPool> ProcessPool::start(const ResourcePool& requested) {
  HF_CHECK(requested.num_processes > 0, "resource pool '", requested.name, "': num_processes must be positive, got ",
           requested.num_processes);
  // In a multi-rank launch the launcher already started the workers: the pool claims some of them.
  transport_detail::Rendezvous* launch = requested.spawn_workers ? transport_detail::launch_rendezvous() : nullptr;
  transport_detail::Rendezvous::Claim claim;
  if (launch) claim = launch->claim(requested);
  const ResourcePool& spec = launch ? claim.spec : requested;
  HF_CHECK(spec.call_timeout_s > 0 && spec.heartbeat_timeout_s > 0 && spec.start_timeout_s > 0,
           "resource pool '", spec.name, "': timeouts must be positive");
  install_signal_handlers();
  HF_CHECK(spec.num_processes < kMaxPoolRanks, "resource pool '", spec.name, "': at most ", kMaxPoolRanks - 1,
           " processes, got ", spec.num_processes);
  HF_CHECK(spec.inline_row_bytes >= 0 && spec.object_table_bytes >= 0 && spec.data_fetch_timeout_s > 0,
           "resource pool '", spec.name, "': inline_row_bytes and object_table_bytes must be >= 0 and ",
           "data_fetch_timeout_s positive");
  auto impl = std::make_shared<Impl>();
  impl->spec = spec;
  if (!spec.token.empty()) check_job_secret(spec.token, "resource pool '" + spec.name + "': token");
  if (!spec.data_token.empty()) check_job_secret(spec.data_token, "resource pool '" + spec.name + "': data_token");
  impl->token = spec.token.empty() ? transport_detail::random_secret() : spec.token;
  impl->data_token = spec.data_token.empty() ? impl->token : spec.data_token;
  impl->pool_index = g_next_pool_index++;
  HF_CHECK(impl->pool_index < (1 << 15), "more than 32767 resource pools in one controller process");
  impl->link = std::make_unique<transport_detail::Link>(impl->token, "pool:" + spec.name, transport_detail::kControllerEnd);
  impl->reject_log = std::make_unique<transport_detail::RejectLog>("resource pool '" + spec.name + "'");
  impl->ranks.resize(spec.num_processes);
  impl->router.set(zmq::sockopt::linger, 0);
  transport_detail::Link::limit(impl->router);
  const std::string listen = "tcp://" + spec.bind_host + ":" + (spec.bind_port > 0 ? std::to_string(spec.bind_port) : "*");
  try {
    impl->router.bind(listen);
  } catch (const zmq::error_t& e) {
    HF_FAIL("resource pool '", spec.name, "': cannot listen on ", listen, " (bind_host/bind_port): ", e.what());
  }
  impl->endpoint = impl->router.get(zmq::sockopt::last_endpoint);
  if (launch) {
    impl->launch_ranks = claim.ranks;
    launch->hand_out(spec, claim.ranks, std::stoi(impl->endpoint.substr(impl->endpoint.rfind(':') + 1)));
  }
  std::shared_ptr<ProcessPool> pool(new ProcessPool(impl));
  impl->io = std::thread([raw = impl.get()] { raw->loop(); });

  std::unique_lock<std::mutex> lock(impl->mutex);
  bool ok = impl->cv.wait_for(lock, std::chrono::duration<double>(spec.start_timeout_s), [&] {
    if (!impl->failure.empty()) return true;
    if (!impl->spawned) return false;
    for (auto& r : impl->ranks)
      if (!r.connected) return false;
    return true;
  });
  std::string failure = impl->failure;
  std::string missing;
  for (size_t r = 0; r < impl->ranks.size(); ++r)
    if (!impl->ranks[r].connected)
      missing += (missing.empty() ? "" : ", ") + std::to_string(r) +
                 (launch ? " (launcher rank " + std::to_string(claim.ranks[r]) + ")" : "");
  lock.unlock();
  if (failure.empty() && !ok) {
    failure = detail::concat("resource pool '", spec.name, "': worker ranks ", missing, " did not connect to ",
                             impl->endpoint, " within start_timeout_s = ", spec.start_timeout_s, " s ",
                             launch ? "(did every launcher rank start, with the same HF_JOB_TOKEN, and can it reach "
                                      "this address?)"
                                    : "(is the worker binary calling run_worker_if_requested()?)");
    impl->fail(failure);
  }
  if (!failure.empty()) {
    pool->shutdown();
    HF_FAIL(failure);
  }
  log_debug("resource pool '", spec.name, "': ", spec.num_processes, " workers connected on ", impl->endpoint);
  return pool;
}

ProcessPool::~ProcessPool() { shutdown(); }

const ResourcePool& ProcessPool::spec() const { return impl_->spec; }
int ProcessPool::size() const { return impl_->spec.num_processes; }
std::string ProcessPool::endpoint() const { return impl_->endpoint; }
std::string ProcessPool::token() const { return impl_->token; }
size_t ProcessPool::rejected_messages() const { return impl_->rejected.load(); }

std::vector<int> ProcessPool::pids() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::vector<int> out;
  for (auto& r : impl_->ranks) out.push_back(r.pid);
  return out;
}

bool ProcessPool::failed() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->failure_handled;
}

bool ProcessPool::wait_failed() const {
  std::unique_lock<std::mutex> lock(impl_->mutex);
  if (impl_->failure.empty()) return false;
  impl_->cv.wait(lock, [&] { return impl_->failure_handled; });
  return true;
}

std::string ProcessPool::failure() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->failure_handled ? impl_->failure : std::string();
}

std::map<std::string, std::string> ProcessPool::create_role(const std::string& role, const std::string& worker_type,
                                                            const std::vector<nlohmann::json>& coords,
                                                            const nlohmann::json& config) {
  HF_CHECK(static_cast<int>(coords.size()) == size(), "worker group '", role, "': ", coords.size(),
           " mesh coordinates for resource pool '", spec().name, "' of ", size(), " processes");
  std::vector<std::optional<Message>> messages(coords.size());
  for (size_t r = 0; r < coords.size(); ++r)
    messages[r] = Message{"", {{"role", role}, {"type", worker_type}, {"pool", spec().name},
                               {"coord", coords[r]}, {"config", config}},
                          std::nullopt};
  auto done = std::make_shared<std::promise<std::map<std::string, std::string>>>();
  auto result = done->get_future();
  impl_->request(
      "create", role, "<create " + worker_type + ">", std::move(messages),
      [done](std::vector<Message>&& replies) {
        done->set_value(replies.at(0).meta.at("methods").get<std::map<std::string, std::string>>());
      },
      [done](std::exception_ptr e) { done->set_exception(e); });
  return result.get();
}

void ProcessPool::submit(const std::string& role, const std::string& method, std::vector<DataProto> inputs,
                         std::function<void(std::vector<DataProto>&&)> on_done,
                         std::function<void(std::exception_ptr)> on_error) {
  std::vector<RankInput> planless;
  for (auto& input : inputs) planless.push_back({std::move(input), nullptr});
  submit(
      role, method, std::move(planless), /*keep_outputs=*/false,
      [on_done](std::vector<RankOutput>&& outputs) {
        std::vector<DataProto> data;
        for (auto& o : outputs) data.push_back(std::move(o.data));
        on_done(std::move(data));
      },
      std::move(on_error));
}

void ProcessPool::submit(const std::string& role, const std::string& method, std::vector<RankInput> inputs,
                         bool keep_outputs, std::function<void(std::vector<RankOutput>&&)> on_done,
                         std::function<void(std::exception_ptr)> on_error) {
  HF_CHECK(static_cast<int>(inputs.size()) == size(), "submit '", role, ".", method, "': ", inputs.size(),
           " inputs for ", size(), " ranks");
  bool all_same = inputs.size() > 1;
  for (size_t r = 1; r < inputs.size() && all_same; ++r) all_same = same_rank_input(inputs[0], inputs[r]);
  const size_t distinct = all_same ? 1 : inputs.size();
  std::vector<Message> contents;
  for (size_t r = 0; r < distinct; ++r) {
    Message m{"", {{"role", role}, {"method", method}}, std::move(inputs[r].data), nullptr};
    if (!inputs[r].plan.is_null()) m.meta["plan"] = std::move(inputs[r].plan);
    if (keep_outputs) m.meta["keep"] = {{"inline_row_bytes", impl_->spec.inline_row_bytes}};
    contents.push_back(std::move(m));
  }
  std::vector<std::optional<Message>> messages(inputs.size());
  if (all_same) {
    auto shared = std::make_shared<transport_detail::SharedContent>(std::move(contents[0]));
    for (auto& m : messages) m = Message{"", nlohmann::json::object(), std::nullopt, shared};
  } else {
    for (size_t r = 0; r < inputs.size(); ++r) messages[r] = std::move(contents[r]);
  }
  impl_->request(
      "call", role, method, std::move(messages),
      [on_done](std::vector<Message>&& replies) {
        std::vector<RankOutput> outputs;
        for (auto& m : replies)
          outputs.push_back({m.data ? std::move(*m.data) : DataProto(), m.meta.value("kept", nlohmann::json())});
        on_done(std::move(outputs));
      },
      std::move(on_error));
}

void ProcessPool::fetch(int rank, int64_t object, const std::vector<std::string>& keys,
                        const std::vector<std::pair<int64_t, int64_t>>& runs, const std::string& role,
                        const std::string& method, std::function<void(DataProto&&)> on_done,
                        std::function<void(std::exception_ptr)> on_error) {
  HF_CHECK(rank >= 0 && rank < size(), "fetch from rank ", rank, " of resource pool '", spec().name, "' of ", size());
  nlohmann::json run_list = nlohmann::json::array();
  for (const auto& [start, count] : runs) run_list.push_back({start, count});
  std::vector<std::optional<Message>> messages(static_cast<size_t>(size()));
  messages[static_cast<size_t>(rank)] =
      Message{"", {{"object", object}, {"keys", keys}, {"runs", run_list}}, std::nullopt};
  impl_->request(
      "fetch", role, method + " (fetching its kept output)", std::move(messages),
      [on_done, rank](std::vector<Message>&& replies) {
        on_done(replies[static_cast<size_t>(rank)].data ? std::move(*replies[static_cast<size_t>(rank)].data)
                                                       : DataProto());
      },
      std::move(on_error));
}

void ProcessPool::release(int64_t object) {
  // Its own lock: a handle may go while the pool's mutex is held (a failed call's callbacks dropped).
  {
    std::lock_guard<std::mutex> lock(impl_->release_mutex);
    impl_->releases.push_back(object);
  }
  impl_->wake.notify();
}

ProcessPool::RankInfo ProcessPool::rank_info(int rank) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const RankState& r = impl_->ranks.at(static_cast<size_t>(rank));
  return {r.pid, r.host, r.data_endpoint, impl_->node_of(rank)};
}

bool ProcessPool::keeps_outputs() const {
  if (!impl_->spec.data_plane) return false;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  for (const auto& r : impl_->ranks)
    if (r.data_endpoint.empty()) return false;
  return true;
}

bool ProcessPool::shares_data_key(const ProcessPool& other) const { return impl_->data_token == other.impl_->data_token; }

bool data_plane_default() {
  const char* v = std::getenv("HF_DATA_PLANE");
  if (v == nullptr || *v == '\0') return true;
  const std::string s = v;
  HF_CHECK(s == "0" || s == "1", "HF_DATA_PLANE=", s, " must be 0 (off) or 1 (on)");
  return s == "1";
}

bool ProcessPool::run_on_helper(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(impl_->waiters_mutex);
  if (impl_->helpers_closed) return false;
  auto& waiters = impl_->waiters;
  for (auto it = waiters.begin(); it != waiters.end();) {
    if (it->done->load()) {
      it->thread.join();
      it = waiters.erase(it);
    } else {
      ++it;
    }
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  waiters.push_back({std::thread([fn = std::move(fn), done] {
                       fn();
                       done->store(true);
                     }),
                     done});
  return true;
}

void ProcessPool::stop() {
  std::map<int64_t, Pending> failed;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->stopping) return;
    impl_->stopping = true;
    failed.swap(impl_->pending);
  }
  for (auto& kv : failed)
    kv.second.on_error(std::make_exception_ptr(Error(detail::concat("resource pool '", impl_->spec.name,
                                                                    "' shut down before '", kv.second.role, ".",
                                                                    kv.second.method, "' finished"))));
}

void ProcessPool::shutdown() {
  std::call_once(impl_->shutdown_once, [this] {
    stop();
    std::vector<Impl::Waiter> waiters;
    {
      std::lock_guard<std::mutex> lock(impl_->waiters_mutex);
      waiters.swap(impl_->waiters);
      impl_->helpers_closed = true;
    }
    for (auto& w : waiters) w.thread.join();
    {
      std::lock_guard<std::mutex> lock(impl_->mutex);
      for (size_t r = 0; r < impl_->ranks.size(); ++r)
        if (impl_->ranks[r].connected && impl_->ranks[r].alive)
          impl_->outbox.emplace_back(static_cast<int>(r),
                                     Message{"shutdown", {{"exit_code", impl_->failure.empty() ? 0 : 1}}, std::nullopt});
      impl_->exiting = true;
      // Spawned workers are waited for (then killed); external ones get a moment to receive the message.
      impl_->exit_deadline = Clock::now() + std::chrono::milliseconds(impl_->spec.spawn_workers ? 1000 : 200);
    }
    impl_->wake.notify();
    if (impl_->io.joinable()) impl_->io.join();
    // The port is free at once (not when the last handle on the pool goes): a restarted pool binds it again
    // under HF_POOL_PORT_BASE.
    impl_->router.close();
    if (impl_->pgid > 0) unregister_pgid(impl_->pgid);
  });
}

}  // namespace hybridflow
