// Actor, critic and reward-model workers called in-process through WorkerHost (the same dispatch a
// worker process runs), on a tiny random model: shapes, log-prob consistency between rollout and
// recomputation, and that updates move the model the way their losses say.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hybridflow/core/error.h"
#include "hybridflow/runtime/worker.h"
#include "hybridflow/workers/rl_batch.h"
#include "hybridflow/workers/rl_workers.h"
#include "hybridflow/workers/role_specs.h"

using namespace hybridflow;

namespace {

nlohmann::json tiny_model() {
  return {{"preset", "tiny"},      {"vocab_size", 12},        {"hidden_size", 32},        {"num_hidden_layers", 1},
          {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"intermediate_size", 64}, {"init_seed", 3},
          {"eos_token_id", 2},     {"pad_token_id", 0}};
}

WorkerContext context(const std::string& role, nlohmann::json config) {
  WorkerContext ctx;
  ctx.role = role;
  ctx.config = std::move(config);
  return ctx;
}

nlohmann::json actor_config(double lr) {
  return {{"model", tiny_model()},
          {"ref", nlohmann::json(RefSpec{})},
          {"actor", {{"lr", lr}, {"mini_batch_rows", 4}, {"micro_batch_rows", 2}, {"epochs", 2}, {"grad_clip", 1.0}}},
          {"rollout", {{"response_length", 5}, {"n", 2}, {"temperature", 1.0}, {"seed", 7}}}};
}

DataProto two_prompts() {
  DataProto p = make_prompt_batch({{1, 5, 6, 7}, {1, 8}}, 0);
  p.set_field("answer", {nlohmann::json("a"), nlohmann::json("b")});
  return p;
}

double masked_mean(const torch::Tensor& v, const torch::Tensor& mask) {
  auto m = mask.to(torch::kFloat);
  return ((v * m).sum() / m.sum()).item<double>();
}

class RlWorkers : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    register_rl_workers();
  }
};

}  // namespace

TEST_F(RlWorkers, GenerateGivesFixedWidthSamplesWhoseLogProbsTheActorReproduces) {
  WorkerHost host;
  auto methods = host.create(kActorRolloutRefWorkerType, context("actor", actor_config(1e-3)));
  EXPECT_EQ(methods.at("generate_sequences"), "DP_PROTO");

  DataProto gen = host.call("actor", "generate_sequences", two_prompts());
  ASSERT_EQ(gen.batch_size(), 4);  // 2 prompts x n = 2, sample j of prompt i at row 2i + j
  EXPECT_EQ(gen.tensor("responses").size(1), 5);
  EXPECT_EQ(gen.tensor("input_ids").size(1), 4 + 5);
  EXPECT_EQ(gen.field("answer")[1], "a");
  EXPECT_EQ(gen.field("answer")[2], "b");
  EXPECT_TRUE(torch::equal(gen.tensor("input_ids").slice(1, 4), gen.tensor("responses")));
  // Nothing follows an eos inside the mask.
  auto mask = gen.tensor("response_mask");
  EXPECT_TRUE(torch::all(mask.slice(1, 1) <= mask.slice(1, 0, 4)).item<bool>());

  DataProto old = host.call("actor", "compute_log_prob", gen);
  EXPECT_TRUE(torch::allclose(old.tensor("old_log_probs"), gen.tensor("rollout_log_probs"), 1e-4, 1e-5));
  DataProto ref = host.call("actor", "compute_ref_log_prob", gen);
  EXPECT_TRUE(torch::allclose(ref.tensor("ref_log_prob"), old.tensor("old_log_probs"), 1e-5, 1e-6))
      << "the reference starts as the actor's initial weights";

  // Greedy with n = 1 overrides per call: deterministic, one row per prompt.
  DataProto greedy_in = two_prompts();
  greedy_in.meta()["greedy"] = true;
  greedy_in.meta()["n"] = 1;
  auto g1 = host.call("actor", "generate_sequences", greedy_in);
  auto g2 = host.call("actor", "generate_sequences", greedy_in);
  EXPECT_EQ(g1.batch_size(), 2);
  EXPECT_TRUE(torch::equal(g1.tensor("responses"), g2.tensor("responses")));
}

TEST_F(RlWorkers, UpdateActorRaisesLogProbsOfPositivelyRewardedSamplesAndKeepsTheReference) {
  WorkerHost host;
  host.create(kActorRolloutRefWorkerType, context("actor", actor_config(3e-3)));
  DataProto batch = host.call("actor", "generate_sequences", two_prompts());
  batch.update(host.call("actor", "compute_log_prob", batch));
  const auto mask = batch.tensor("response_mask");
  // Samples 0 and 2 good, 1 and 3 bad.
  auto sign = torch::tensor({1.f, -1.f, 1.f, -1.f}).unsqueeze(1);
  batch.set_tensor("advantages", sign * mask.to(torch::kFloat));
  const double norm_before = host.call("actor", "parameter_norm", DataProto()).tensor("param_sq_norm")[0].item<double>();

  DataProto out = host.call("actor", "update_actor", batch);
  const auto& metrics = out.meta().at("metrics");
  for (const char* key : {"actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy", "actor/grad_norm", "actor/lr"})
    EXPECT_TRUE(metrics.contains(key)) << key << " missing in " << metrics.dump();
  EXPECT_GT(metrics.at("actor/grad_norm").get<double>(), 0.0);

  const double norm_after = host.call("actor", "parameter_norm", DataProto()).tensor("param_sq_norm")[0].item<double>();
  EXPECT_NE(norm_before, norm_after);
  auto before = batch.tensor("old_log_probs");
  auto after = host.call("actor", "compute_log_prob", batch).tensor("old_log_probs");
  auto good = mask.clone();
  good[1].zero_();
  good[3].zero_();
  auto bad = mask - good;
  EXPECT_GT(masked_mean(after - before, good), masked_mean(after - before, bad));
  auto ref = host.call("actor", "compute_ref_log_prob", batch).tensor("ref_log_prob");
  EXPECT_TRUE(torch::allclose(ref, before, 1e-5, 1e-6)) << "the reference must stay frozen";
}

TEST_F(RlWorkers, ActorWithoutReferenceSaysSoAndKlLossNeedsTheReference) {
  WorkerHost host;
  auto cfg = actor_config(1e-3);
  cfg.erase("ref");
  cfg["actor"]["use_kl_loss"] = true;
  host.create(kActorRolloutRefWorkerType, context("actor", cfg));
  DataProto batch = host.call("actor", "generate_sequences", two_prompts());
  try {
    host.call("actor", "compute_ref_log_prob", batch);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has_ref"), std::string::npos) << e.what();
  }
  batch.update(host.call("actor", "compute_log_prob", batch));
  batch.set_tensor("advantages", torch::zeros({4, 5}));
  EXPECT_THROW(host.call("actor", "update_actor", batch), Error);
}

TEST_F(RlWorkers, CriticValuesMoveTowardTheReturns) {
  WorkerHost host;
  host.create(kCriticWorkerType, context("critic", {{"model", tiny_model()},
                                                    {"critic", {{"lr", 1e-2}, {"epochs", 4}, {"cliprange_value", 10.0}}}}));
  WorkerHost actor_host;
  actor_host.create(kActorRolloutRefWorkerType, context("actor", actor_config(1e-3)));
  DataProto batch = actor_host.call("actor", "generate_sequences", two_prompts());
  const auto mask = batch.tensor("response_mask").to(torch::kFloat);

  DataProto values = host.call("critic", "compute_values", batch);
  ASSERT_EQ(values.tensor("values").sizes(), mask.sizes());
  EXPECT_EQ((values.tensor("values") * (1 - mask)).abs().sum().item<float>(), 0.f) << "masked positions are 0";
  batch.update(values);
  batch.set_tensor("returns", mask * 2.0);
  const double error_before = masked_mean((values.tensor("values") - 2.0).abs(), mask);
  DataProto out = host.call("critic", "update_critic", batch);
  EXPECT_TRUE(out.meta().at("metrics").contains("critic/vf_loss"));
  const double error_after = masked_mean((host.call("critic", "compute_values", batch).tensor("values") - 2.0).abs(), mask);
  EXPECT_LT(error_after, error_before);
}

TEST_F(RlWorkers, RewardModelScoresTheLastRealTokenIgnoringRightPadding) {
  WorkerHost host;
  host.create(kRewardModelWorkerType, context("rm", {{"model", tiny_model()}}));
  DataProto a = make_prompt_batch({{1, 5, 6}, {1, 7}}, 0);
  DataProto padded;
  padded.set_tensor("input_ids", torch::cat({a.tensor("input_ids"), torch::zeros({2, 2}, torch::kLong)}, 1));
  padded.set_tensor("attention_mask", torch::cat({a.tensor("attention_mask"), torch::zeros({2, 2}, torch::kLong)}, 1));
  auto s1 = host.call("rm", "compute_rm_score", a).tensor("rm_scores");
  auto s2 = host.call("rm", "compute_rm_score", padded).tensor("rm_scores");
  ASSERT_EQ(s1.sizes(), (std::vector<int64_t>{2}));
  EXPECT_TRUE(torch::allclose(s1, s2, 1e-5, 1e-6));
  EXPECT_NE(s1[0].item<float>(), s1[1].item<float>());
}
