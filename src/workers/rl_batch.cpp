#include "hybridflow/workers/rl_batch.h"

#include "hybridflow/core/error.h"

namespace hybridflow {

DataProto make_prompt_batch(const std::vector<std::vector<int64_t>>& prompts, int64_t pad_id) {
  HF_CHECK(!prompts.empty(), "make_prompt_batch: no prompts");
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  const auto rows = static_cast<int64_t>(prompts.size());
  auto ids = torch::full({rows, static_cast<int64_t>(longest)}, pad_id, torch::kLong);
  auto mask = torch::zeros({rows, static_cast<int64_t>(longest)}, torch::kLong);
  for (int64_t i = 0; i < rows; ++i) {
    const auto& p = prompts[static_cast<size_t>(i)];
    HF_CHECK(!p.empty(), "make_prompt_batch: prompt ", i, " is empty");
    const int64_t offset = static_cast<int64_t>(longest - p.size());
    ids[i].slice(0, offset) = torch::tensor(p, torch::kLong);
    mask[i].slice(0, offset).fill_(1);
  }
  DataProto out;
  out.set_tensor("input_ids", ids);
  out.set_tensor("attention_mask", mask);
  return out;
}

std::vector<std::vector<int64_t>> prompt_token_lists(const DataProto& in) {
  std::vector<std::vector<int64_t>> prompts;
  if (in.has_tensor("input_ids")) {
    // Read on the host: one copy, not a device sync per element.
    const auto ids = in.tensor("input_ids").to(torch::kCPU, torch::kLong).contiguous();
    const auto mask = in.has_tensor("attention_mask")
                          ? in.tensor("attention_mask").to(torch::kCPU, torch::kLong).contiguous()
                          : torch::ones_like(ids);
    for (int64_t i = 0; i < ids.size(0); ++i) {
      std::vector<int64_t> row;
      for (int64_t t = 0; t < ids.size(1); ++t)
        if (mask[i][t].item<int64_t>() != 0) row.push_back(ids[i][t].item<int64_t>());
      prompts.push_back(std::move(row));
    }
    return prompts;
  }
  HF_CHECK(in.has_field("prompt_ids"), "generate_sequences: expected tensors input_ids/attention_mask or field ",
           "prompt_ids, got ", in.summary());
  for (const auto& v : in.field("prompt_ids")) prompts.push_back(v.get<std::vector<int64_t>>());
  return prompts;
}

DataProto rollout_batch(const GenerationOutput& out, int64_t response_length, int64_t pad_id) {
  const int64_t rows = out.responses.size(0);
  const int64_t got = out.responses.size(1);
  HF_CHECK(got <= response_length, "rollout_batch: generated ", got, " tokens, more than response_length ",
           response_length);
  const auto on = torch::TensorOptions().device(out.responses.device());
  auto responses = torch::full({rows, response_length}, pad_id, on.dtype(torch::kLong));
  auto response_mask = torch::zeros({rows, response_length}, on.dtype(torch::kLong));
  auto log_probs = torch::zeros({rows, response_length}, on.dtype(torch::kFloat));
  if (got > 0) {
    responses.slice(1, 0, got).copy_(out.responses);
    response_mask.slice(1, 0, got).copy_(out.response_mask);
    log_probs.slice(1, 0, got).copy_(out.log_probs);
  }
  DataProto b;
  b.set_tensor("prompts", out.prompts.to(torch::kLong));
  b.set_tensor("responses", responses);
  b.set_tensor("response_mask", response_mask);
  b.set_tensor("input_ids", torch::cat({out.prompts.to(torch::kLong), responses}, 1));
  b.set_tensor("attention_mask", torch::cat({out.prompt_mask.to(torch::kLong), response_mask}, 1));
  b.set_tensor("rollout_log_probs", log_probs);
  if (out.routed_experts.defined()) {
    // Router replay: the rollout's experts per token of input_ids, -1 past the generated tokens.
    auto sizes = out.routed_experts.sizes().vec();
    sizes[1] = out.prompts.size(1) + response_length;
    auto routed = torch::full(sizes, -1, on.dtype(out.routed_experts.scalar_type()));
    routed.narrow(1, 0, out.routed_experts.size(1)).copy_(out.routed_experts);
    b.set_tensor("routed_experts", routed);
  }
  return b;
}

torch::Tensor last_valid_index(const torch::Tensor& mask) {
  const auto m = (mask != 0).to(torch::kLong);
  const auto positions = torch::arange(m.size(1), m.options()).unsqueeze(0);
  return (m * positions).amax(1);
}

torch::Tensor scores_at_last_token(const torch::Tensor& scores, const torch::Tensor& response_mask) {
  HF_CHECK(scores.dim() == 1 && scores.size(0) == response_mask.size(0), "scores_at_last_token: scores ",
           scores.sizes(), " do not match response_mask ", response_mask.sizes());
  auto out = torch::zeros(response_mask.sizes(), response_mask.options().dtype(torch::kFloat));
  const auto has_tokens = (response_mask != 0).any(1).to(torch::kFloat);
  out.scatter_(1, last_valid_index(response_mask).unsqueeze(1),
               (scores.to(out.device(), torch::kFloat) * has_tokens).unsqueeze(1));
  return out;
}

}  // namespace hybridflow
