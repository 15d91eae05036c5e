#include "hybridflow/workers/data_parallel.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <set>

#include "hybridflow/core/error.h"
#include "hybridflow/parallel/launch_env.h"
#include "hybridflow/runtime/launcher.h"
#include "hybridflow/runtime/worker_group.h"

namespace hybridflow {
namespace {

nlohmann::json stats_json(const CommStats& stats) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [op, s] : stats.snapshot()) out[op] = {{"calls", s.calls}, {"bytes", s.bytes}, {"seconds", s.seconds}};
  return out;
}

}  // namespace

std::string endpoint_host(const std::string& endpoint) {
  std::string rest = endpoint;
  const size_t scheme = rest.find("://");
  if (scheme != std::string::npos) rest = rest.substr(scheme + 3);
  std::string host;
  if (!rest.empty() && rest.front() == '[') {
    const size_t close = rest.find(']');
    HF_CHECK(close != std::string::npos, "endpoint '", endpoint, "': unbalanced '[' around an IPv6 address");
    host = rest.substr(1, close - 1);
  } else {
    host = rest.substr(0, rest.rfind(':'));
  }
  HF_CHECK(!host.empty(), "endpoint '", endpoint, "' names no host (expected tcp://HOST:PORT)");
  return host;
}

std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), "9", &hints, &found);
  HF_CHECK(rc == 0, "data parallel: cannot resolve the controller host '", host, "': ", ::gai_strerror(rc));
  std::string out;
  for (addrinfo* a = found; a != nullptr && out.empty(); a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    // Connecting a UDP socket only asks the kernel for a route; the local end is the address peers use.
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* addr = local.ss_family == AF_INET6
                             ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                             : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
      if (::inet_ntop(local.ss_family, addr, text, sizeof(text)) != nullptr) out = text;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  HF_CHECK(!out.empty(), "data parallel: no local address has a route to the controller host '", host, "'");
  return out;
}

DataParallel::DataParallel(ProcessGroup group, std::string role, torch::Device device)
    : role_(std::move(role)), device_(device), gradients_(group), control_(group) {}

std::unique_ptr<DataParallel> DataParallel::join(const WorkerContext& context, torch::nn::Module& module,
                                                 TrainEngine& engine) {
  const int world = context.coord.world_size;
  if (world <= 1) return nullptr;
  HF_CHECK(context.config.contains(kProcessGroupKey), "role '", context.role, "' has ", world,
           " processes but its config has no '", kProcessGroupKey,
           "' rendezvous; create it through WorkerGroup, which hosts the store");
  const auto& pg = context.config.at(kProcessGroupKey);
  HF_CHECK(pg.value("world_size", world) == world, "role '", context.role, "': '", kProcessGroupKey,
           "' says world_size ", pg.value("world_size", world), " but the rank's coordinates say ", world);
  // The store runs in the controller: reach it where this worker reached the controller.
  const char* controller = std::getenv(kControllerAddrEnv);
  const char* endpoint = std::getenv("HF_WORKER_ENDPOINT");
  LaunchEnv env;
  env.rank = context.coord.rank;
  env.world_size = world;
  if (controller != nullptr && *controller != '\0' && std::string(controller) != "0.0.0.0")
    env.master_addr = controller;
  else if (endpoint != nullptr && *endpoint != '\0')
    env.master_addr = endpoint_host(endpoint);
  else
    env.master_addr = pg.value("store_host", std::string("127.0.0.1"));
  env.master_port = pg.at("store_port").get<int>();
  // Collectives move tensors where the replica lives: Gloo on the CPU, NCCL on CUDA devices.
  const torch::Device device = module.parameters().front().device();
  ProcessGroupOptions options;
  options.device = device.is_cuda() ? "cuda" : "cpu";
  options.rank0_hosts_store = false;
  options.gloo_hostname = local_address_towards(env.master_addr);
  // Ranks reach a collective within one call of each other; a dead peer fails the pool through heartbeats.
  options.timeout = std::chrono::seconds(pg.value("timeout_s", 300));
  std::unique_ptr<DataParallel> dp(new DataParallel(ProcessGroup::create_world(env, options), context.role, device));

  torch::NoGradGuard no_grad;
  auto params = module.parameters();
  std::vector<torch::Tensor> parts;
  for (const auto& p : params) parts.push_back(p.detach().reshape({-1}).to(torch::kFloat));
  torch::Tensor flat = torch::cat(parts).contiguous();
  dp->gradients_.broadcast(flat, 0);
  int64_t offset = 0;
  for (auto& p : params) {
    p.copy_(flat.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
  engine.set_gradient_reducer([comm = &dp->gradients_](torch::Tensor& t) { comm->all_reduce(t, ReduceOp::kSum); });
  return dp;
}

void DataParallel::check_same_rows(int64_t rows, const std::string& what) {
  torch::Tensor t = torch::tensor({rows, -rows}, torch::kLong).to(device_);
  control_.all_reduce(t, ReduceOp::kMax);
  const int64_t most = t[0].item<int64_t>();
  const int64_t least = -t[1].item<int64_t>();
  HF_CHECK(most == least, what, ": the ", size(), " data-parallel ranks of role '", role_, "' hold between ", least,
           " and ", most, " rows; every rank needs the same number (DP_PROTO splits the batch evenly)");
}

nlohmann::json DataParallel::metrics(const MetricAverager& local, const std::string& prefix) {
  std::string names;
  for (const auto& entry : local.sums()) names += entry.first + '\n';
  torch::Tensor len = torch::tensor({static_cast<int64_t>(names.size())}, torch::kLong).to(device_);
  control_.all_reduce(len, ReduceOp::kMax);
  const int64_t longest = len.item<int64_t>();
  std::set<std::string> all;
  if (longest > 0) {
    torch::Tensor bytes = torch::zeros({longest}, torch::kUInt8);
    std::memcpy(bytes.data_ptr<uint8_t>(), names.data(), names.size());
    for (const auto& gathered : control_.all_gather(bytes.to(device_))) {
      const torch::Tensor part = gathered.cpu();
      std::string text(reinterpret_cast<const char*>(part.data_ptr<uint8_t>()), static_cast<size_t>(longest));
      text = text.substr(0, text.find('\0'));
      for (size_t begin = 0, end; begin < text.size(); begin = end + 1) {
        end = text.find('\n', begin);
        if (end == std::string::npos) end = text.size();
        if (end > begin) all.insert(text.substr(begin, end - begin));
      }
    }
  }
  const std::vector<std::string> order(all.begin(), all.end());
  torch::Tensor sums = torch::zeros({static_cast<int64_t>(2 * order.size())}, torch::kDouble);
  auto* s = sums.data_ptr<double>();
  for (size_t i = 0; i < order.size(); ++i) {
    auto it = local.sums().find(order[i]);
    if (it == local.sums().end()) continue;
    s[2 * i] = it->second.first;
    s[2 * i + 1] = static_cast<double>(it->second.second);
  }
  if (!order.empty()) {
    torch::Tensor reduced = sums.to(device_);
    control_.all_reduce(reduced, ReduceOp::kSum);
    sums.copy_(reduced);
  }
  nlohmann::json out = nlohmann::json::object();
  for (size_t i = 0; i < order.size(); ++i)
    if (s[2 * i + 1] > 0) out[order[i]] = s[2 * i] / s[2 * i + 1];
  const OpStats now = gradients_.stats().of("all_reduce");
  out[prefix + "dp_allreduce_bytes"] = static_cast<double>(now.bytes - reported_.bytes);
  out[prefix + "dp_allreduce_s"] = now.seconds - reported_.seconds;
  reported_ = now;
  return out;
}

nlohmann::json DataParallel::comm_stats() const {
  return {{"gradient", stats_json(gradients_.stats())}, {"control", stats_json(control_.stats())}};
}

DataProto left_pad_prompts(const DataProto& rollout, int64_t width, int64_t pad_id) {
  const int64_t have = rollout.tensor("prompts").size(1);
  HF_CHECK(have <= width, "left_pad_prompts: the rollout's prompts are ", have, " wide, more than the ", width,
           " columns asked for");
  if (have == width) return rollout;
  const int64_t rows = rollout.batch_size();
  auto pad = [&](const std::string& key, int64_t value) {
    const auto& t = rollout.tensor(key);
    return torch::cat({torch::full({rows, width - have}, value, t.options()), t}, 1);
  };
  DataProto out = rollout;
  out.set_tensor("prompts", pad("prompts", pad_id));
  out.set_tensor("input_ids", pad("input_ids", pad_id));
  out.set_tensor("attention_mask", pad("attention_mask", 0));
  return out;
}

DataProto flat_parameters(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> parts;
  for (const auto& p : module.parameters()) parts.push_back(p.detach().reshape({-1}).to(torch::kFloat));
  DataProto out;
  out.set_tensor("parameters", torch::cat(parts).unsqueeze(0).contiguous());
  return out;
}

}  // namespace hybridflow
