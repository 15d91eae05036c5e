// The actor with LoRA, called in-process through WorkerHost: the reference policy is the actor with its
// adapters switched off, so after PPO updates its log-probs are bit for bit those of the base model (an
// actor built without adapters and never updated); generation merges the adapters into the weights for the
// call and leaves every weight bit for bit as it was, and generating with the adapters applied separately
// (rollout lora_merge false) gives the same policy within float rounding.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hybridflow/runtime/worker.h"
#include "hybridflow/workers/rl_batch.h"
#include "hybridflow/workers/rl_workers.h"
#include "hybridflow/workers/role_specs.h"

using namespace hybridflow;

namespace {

nlohmann::json tiny_model(int64_t lora_rank) {
  return {{"preset", "tiny"},
          {"vocab_size", 12},
          {"hidden_size", 32},
          {"num_hidden_layers", 1},
          {"num_attention_heads", 2},
          {"num_key_value_heads", 1},
          {"intermediate_size", 64},
          {"init_seed", 3},
          {"eos_token_id", 2},
          {"pad_token_id", 0},
          {"lora_rank", lora_rank},
          {"lora_alpha", 8},
          {"lora_key", "actor_rollout_ref.model"}};
}

WorkerContext context(const std::string& role, nlohmann::json config) {
  WorkerContext ctx;
  ctx.role = role;
  ctx.config = std::move(config);
  return ctx;
}

nlohmann::json actor_config(int64_t lora_rank, bool lora_merge) {
  return {{"model", tiny_model(lora_rank)},
          {"ref", nlohmann::json(RefSpec{})},
          {"actor", {{"lr", 3e-2}, {"mini_batch_rows", 4}, {"micro_batch_rows", 2}, {"epochs", 2}, {"grad_clip", 1.0}}},
          {"rollout", {{"response_length", 5}, {"n", 2}, {"temperature", 1.0}, {"seed", 7}, {"lora_merge", lora_merge}}}};
}

DataProto two_prompts() { return make_prompt_batch({{1, 5, 6, 7}, {1, 8}}, 0); }

torch::Tensor flat(WorkerHost& host, const std::string& role) {
  return host.call(role, "flat_parameters", DataProto()).tensor("parameters");
}

// Two PPO updates of `role` on its own samples with alternating advantages.
DataProto train(WorkerHost& host, const std::string& role) {
  DataProto batch;
  for (int i = 0; i < 2; ++i) {
    batch = host.call(role, "generate_sequences", two_prompts());
    batch.update(host.call(role, "compute_log_prob", batch));
    auto sign = torch::tensor({1.f, -1.f, 1.f, -1.f}).unsqueeze(1);
    batch.set_tensor("advantages", sign * batch.tensor("response_mask").to(torch::kFloat));
    host.call(role, "update_actor", batch);
  }
  return batch;
}

class LoraActor : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    register_rl_workers();
  }
};

}  // namespace

TEST_F(LoraActor, TheReferenceIsTheBaseModelAfterUpdates) {
  WorkerHost host;
  host.create(kActorRolloutRefWorkerType, context("lora", actor_config(4, true)));
  host.create(kActorRolloutRefWorkerType, context("base", actor_config(0, true)));
  const DataProto batch = train(host, "lora");
  const torch::Tensor policy = host.call("lora", "compute_log_prob", batch).tensor("old_log_probs");
  const torch::Tensor ref = host.call("lora", "compute_ref_log_prob", batch).tensor("ref_log_prob");
  const torch::Tensor base = host.call("base", "compute_log_prob", batch).tensor("old_log_probs");
  EXPECT_TRUE(torch::equal(ref, base)) << "max diff " << (ref - base).abs().max().item<double>();
  EXPECT_FALSE(torch::allclose(policy, base)) << "the adapters trained, so the policy moved off the base";
  // The switch is back on after the reference pass.
  EXPECT_TRUE(torch::equal(host.call("lora", "compute_log_prob", batch).tensor("old_log_probs"), policy));
}

TEST_F(LoraActor, GenerationMergesTheAdaptersAndRestoresEveryWeightBitForBit) {
  WorkerHost host;
  host.create(kActorRolloutRefWorkerType, context("merged", actor_config(4, true)));
  host.create(kActorRolloutRefWorkerType, context("separate", actor_config(4, false)));
  train(host, "merged");
  train(host, "separate");
  // Merging for generation changes no weight, so both actors trained the same steps.
  const torch::Tensor weights = flat(host, "merged");
  ASSERT_TRUE(torch::equal(weights, flat(host, "separate")));

  DataProto in = two_prompts();
  in.meta()["greedy"] = true;
  in.meta()["n"] = 1;
  const DataProto merged = host.call("merged", "generate_sequences", in);
  EXPECT_TRUE(torch::equal(flat(host, "merged"), weights)) << "unmerge must restore the weights exactly";
  const DataProto separate = host.call("separate", "generate_sequences", in);
  EXPECT_TRUE(torch::equal(flat(host, "separate"), weights));
  // The same policy either way, within the rounding of W + BA against W x + B(A x).
  EXPECT_TRUE(torch::equal(merged.tensor("responses"), separate.tensor("responses")));
  EXPECT_TRUE(torch::allclose(merged.tensor("rollout_log_probs"), separate.tensor("rollout_log_probs"), 1e-4, 1e-5));
  const torch::Tensor recomputed = host.call("merged", "compute_log_prob", merged).tensor("old_log_probs");
  EXPECT_TRUE(torch::allclose(recomputed, merged.tensor("rollout_log_probs"), 1e-4, 1e-5));
}
