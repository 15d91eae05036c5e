#include "hybridflow/workers/data_parallel.h"

#include <cstring>
#include <set>

#include "hybridflow/core/error.h"
#include "hybridflow/workers/expert_parallel_ranks.h"

namespace hybridflow {
namespace {

nlohmann::json stats_json(const CommStats& stats) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [op, s] : stats.snapshot()) out[op] = {{"calls", s.calls}, {"bytes", s.bytes}, {"seconds", s.seconds}};
  return out;
}

}  // namespace

DataParallel::DataParallel(ProcessGroup group, std::string role, torch::Device device)
    : role_(std::move(role)), device_(device), gradients_(group), control_(group) {}

std::unique_ptr<DataParallel> DataParallel::join(const ProcessGroup& group, const std::string& role,
                                                 torch::nn::Module& module, TrainEngine& engine,
                                                 bool sharded_optimizer, bool experts_per_rank) {
  if (group.size() <= 1) return nullptr;
  const torch::Device device = module.parameters().front().device();
  std::unique_ptr<DataParallel> dp(new DataParallel(group, role, device));
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> params;
  for (const auto& item : module.named_parameters())
    if (!experts_per_rank || !is_expert_parameter_name(item.key())) params.push_back(item.value());
  std::vector<torch::Tensor> parts;
  for (const auto& p : params) parts.push_back(p.detach().reshape({-1}).to(torch::kFloat));
  torch::Tensor flat = torch::cat(parts).contiguous();
  dp->gradients_.broadcast(flat, 0);
  int64_t offset = 0;
  for (auto& p : params) {
    p.copy_(flat.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
  if (sharded_optimizer)
    engine.set_sharded_optimizer(dp->gradients_);
  else
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
  // The parameter broadcast at join is a broadcast: every other op on this communicator moves gradients.
  OpStats now;
  for (const char* op : {"all_reduce", "reduce_scatter", "all_gather"}) {
    const OpStats s = gradients_.stats().of(op);
    now.bytes += s.bytes;
    now.seconds += s.seconds;
  }
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
  auto pad = [&](const std::string& key, int64_t value) {
    const auto& t = rollout.tensor(key);
    auto sizes = t.sizes().vec();
    sizes[1] = width - have;
    return torch::cat({torch::full(sizes, value, t.options()), t}, 1);
  };
  DataProto out = rollout;
  out.set_tensor("prompts", pad("prompts", pad_id));
  out.set_tensor("input_ids", pad("input_ids", pad_id));
  out.set_tensor("attention_mask", pad("attention_mask", 0));
  if (rollout.has_tensor("routed_experts")) out.set_tensor("routed_experts", pad("routed_experts", -1));
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
