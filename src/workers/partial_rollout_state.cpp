#include "hybridflow/workers/partial_rollout_state.h"

#include <iterator>

#include "hybridflow/core/error.h"

namespace hybridflow {

namespace {

constexpr const char* kPartialTensors[] = {"partial_responses", "partial_log_probs", "partial_token_versions",
                                           "partial_lengths", "partial_finished"};

}  // namespace

DataProto partial_rollout_state(const GenerationOutput& out, int64_t prompts, int64_t n, int64_t response_length,
                                int64_t pad_token_id) {
  const int64_t rows = prompts * n;
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  auto responses = torch::full({rows, response_length}, pad_token_id, i64);
  auto log_probs = torch::zeros({rows, response_length}, torch::TensorOptions().dtype(torch::kFloat32));
  auto versions = torch::zeros({rows, response_length}, i64);
  const int64_t width = std::min<int64_t>(out.responses.size(1), response_length);
  const auto mask = out.response_mask.to(torch::kCPU).narrow(1, 0, width);
  responses.narrow(1, 0, width).copy_(out.responses.to(torch::kCPU).narrow(1, 0, width).masked_fill(mask == 0, pad_token_id));
  log_probs.narrow(1, 0, width).copy_(out.log_probs.to(torch::kCPU).narrow(1, 0, width) * mask);
  if (out.token_versions.defined())
    versions.narrow(1, 0, width).copy_(out.token_versions.to(torch::kCPU).narrow(1, 0, width) * mask);
  DataProto state;
  state.set_tensor("partial_responses", responses.view({prompts, n, response_length}));
  state.set_tensor("partial_log_probs", log_probs.view({prompts, n, response_length}));
  state.set_tensor("partial_token_versions", versions.view({prompts, n, response_length}));
  state.set_tensor("partial_lengths", mask.sum(1).view({prompts, n}).to(torch::kInt64));
  state.set_tensor("partial_finished", out.finished.to(torch::kCPU, torch::kInt64).view({prompts, n}));
  state.meta()["partial"] = true;
  return state;
}

bool is_partial_rollout_state(const DataProto& batch) { return batch.meta().value("partial", false); }

DataProto continuation_request(const DataProto& request, const DataProto& state) {
  DataProto out = request;
  for (const char* key : kPartialTensors) out.set_tensor(key, state.tensor(key));
  return out;
}

bool holds_partial_responses(const DataProto& request) { return request.has_tensor("partial_responses"); }

PartialSequences partial_sequences_of(const DataProto& request, int64_t n, int64_t response_length,
                                      int64_t newest_version, const std::string& source) {
  const int64_t prompts = request.batch_size();
  for (size_t k = 0; k < std::size(kPartialTensors); ++k) {
    const char* key = kPartialTensors[k];
    HF_CHECK(request.has_tensor(key), source, ": the partial responses lack '", key, "'");
    const torch::Tensor& t = request.tensor(key);
    const bool per_token = k < 3;  // responses, log-probs, versions; then lengths and flags per sample
    const bool fits = t.dim() == (per_token ? 3 : 2) && t.size(0) == prompts && t.size(1) == n &&
                      (!per_token || t.size(2) == response_length);
    HF_CHECK(fits, source, ": '", key, "' has shape ", t.sizes(), ", expected [", prompts, ", ", n,
             per_token ? ", " + std::to_string(response_length) : std::string(), "] for ", prompts,
             " prompts, actor_rollout_ref.rollout.n = ", n, " and response_length = ", response_length);
  }
  const auto responses = request.tensor("partial_responses").to(torch::kCPU, torch::kInt64).reshape({prompts * n, -1});
  const auto log_probs = request.tensor("partial_log_probs").to(torch::kCPU, torch::kFloat32).reshape({prompts * n, -1});
  const auto versions =
      request.tensor("partial_token_versions").to(torch::kCPU, torch::kInt64).reshape({prompts * n, -1});
  const auto lengths = request.tensor("partial_lengths").to(torch::kCPU, torch::kInt64).reshape({-1});
  const auto finished = request.tensor("partial_finished").to(torch::kCPU, torch::kInt64).reshape({-1});
  PartialSequences saved;
  for (int64_t q = 0; q < prompts * n; ++q) {
    const int64_t length = lengths[q].item<int64_t>();
    HF_CHECK(length >= 0 && length <= response_length, source, ": sample ", q, " holds ", length,
             " tokens, outside [0, response_length = ", response_length, "]");
    const auto tokens = responses[q].narrow(0, 0, length).contiguous();
    const auto lp = log_probs[q].narrow(0, 0, length).contiguous();
    const auto v = versions[q].narrow(0, 0, length).contiguous();
    HF_CHECK(torch::isfinite(lp).all().item<bool>() && (lp <= 0).all().item<bool>(), source, ": sample ", q,
             " has log-probs that are not finite and <= 0");
    HF_CHECK(length == 0 || v.max().item<int64_t>() <= newest_version, source, ": sample ", q,
             " has a token of policy version ", length ? v.max().item<int64_t>() : 0, ", newer than the ",
             newest_version, " this run holds");
    saved.tokens.emplace_back(tokens.data_ptr<int64_t>(), tokens.data_ptr<int64_t>() + length);
    saved.log_probs.emplace_back(lp.data_ptr<float>(), lp.data_ptr<float>() + length);
    saved.versions.emplace_back(v.data_ptr<int64_t>(), v.data_ptr<int64_t>() + length);
    saved.finished.push_back(finished[q].item<int64_t>() != 0);
  }
  return saved;
}

}  // namespace hybridflow
