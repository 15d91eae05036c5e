// verl's dynamic batch size over real worker processes: the same role with micro-batches of rows (padded to
// the batch's width) and by token count (sorted, trimmed to each micro-batch's longest prompt and response)
// must give the same old and reference log-probs, values and reward-model scores, and take the same updates
// for every loss_agg_mode, also with the token-count micro-batches on 2 data-parallel ranks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hybridflow/core/error.h"
#include "hybridflow/runtime/controller.h"
#include "hybridflow/runtime/worker.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/workers/rl_batch.h"
#include "hybridflow/workers/rl_workers.h"

using namespace hybridflow;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

namespace {

constexpr double kTolerance = 1e-5;
constexpr int64_t kRows = 8, kResponse = 6;
// Small budgets: micro-batches of one to four trimmed rows.
constexpr int64_t kUpdateBudget = 16, kForwardBudget = 24;

nlohmann::json tiny_model() {
  return {{"preset", "tiny"},      {"vocab_size", 12},        {"hidden_size", 32},        {"num_hidden_layers", 2},
          {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"intermediate_size", 64}, {"init_seed", 3},
          {"eos_token_id", 2},     {"pad_token_id", 0}};
}

nlohmann::json optim(int64_t mini_batch_rows, const std::string& agg, int64_t max_token_len) {
  return {{"lr", 1e-2},          {"weight_decay", 0.0}, {"grad_clip", 0.5},      {"mini_batch_rows", mini_batch_rows},
          {"micro_batch_rows", 2}, {"epochs", 2},        {"shuffle", false},     {"loss_agg_mode", agg},
          {"cliprange_value", 0.2}, {"max_token_len", max_token_len}, {"entropy_coeff", 0.01},
          {"use_kl_loss", true}};
}

// dynamic: every pass by token count.
nlohmann::json actor_config(int64_t mini, const std::string& agg, bool dynamic) {
  return {{"model", tiny_model()},
          {"ref", {{"log_prob_micro_batch_size", 3}, {"log_prob_max_token_len", dynamic ? kForwardBudget : 0}}},
          {"actor", optim(mini, agg, dynamic ? kUpdateBudget : 0)},
          {"rollout",
           {{"response_length", kResponse},
            {"n", 2},
            {"seed", 11},
            {"log_prob_micro_batch_size", 3},
            {"log_prob_max_token_len", dynamic ? kForwardBudget : 0}}}};
}

nlohmann::json critic_config(int64_t mini, const std::string& agg, bool dynamic) {
  nlohmann::json critic = optim(mini, agg, dynamic ? kUpdateBudget : 0);
  critic.update({{"forward_micro_batch_size", 3}, {"forward_max_token_len", dynamic ? kForwardBudget : 0}});
  return {{"model", tiny_model()},
          {"critic", critic}};
}

nlohmann::json rm_config(bool dynamic) {
  return {{"model", tiny_model()}, {"scoring", {{"micro_batch_size", 3}, {"max_token_len", dynamic ? kForwardBudget : 0}}}};
}

WorkerContext context(const std::string& role, nlohmann::json config) {
  WorkerContext ctx;
  ctx.role = role;
  ctx.config = std::move(config);
  return ctx;
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

// Single-process roles run in this process (WorkerHost, the dispatch a worker process runs); the
// data-parallel check runs 2 worker processes.
class DynamicBatchSize : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    at::set_num_threads(1);
    host_ = new WorkerHost();
    host_->create(kActorRolloutRefWorkerType, context("gen", actor_config(4, "token-mean", false)));
    // Prompts of 1 to 5 tokens (left padded), two samples each.
    DataProto batch = host_->call("gen", "generate_sequences",
                                  make_prompt_batch({{1, 5, 6, 7, 4}, {1}, {1, 9, 4}, {1, 3}}, 0));
    // Responses of 0 to 6 tokens: the rest is padding in every tensor, as a rollout that stopped leaves it.
    const std::vector<int64_t> lengths = {6, 1, 3, 0, 2, 4, 6, 1};
    auto mask = torch::zeros({kRows, kResponse}, torch::kLong);
    for (int64_t r = 0; r < kRows; ++r) mask[r].narrow(0, 0, lengths[static_cast<size_t>(r)]).fill_(1);
    const int64_t prompt = batch.tensor("prompts").size(1);
    batch.set_tensor("response_mask", mask);
    batch.set_tensor("responses", batch.tensor("responses").masked_fill(mask == 0, 0));
    batch.set_tensor("input_ids", torch::cat({batch.tensor("prompts"), batch.tensor("responses")}, 1));
    auto attention = batch.tensor("attention_mask").clone();
    attention.narrow(1, prompt, kResponse).copy_(mask);
    batch.set_tensor("attention_mask", attention);
    batch.update(host_->call("gen", "compute_log_prob", batch));
    batch.update(host_->call("gen", "compute_ref_log_prob", batch));
    host_->create(kCriticWorkerType, context("values", critic_config(4, "token-mean", false)));
    batch.update(host_->call("values", "compute_values", batch));
    torch::manual_seed(5);
    batch.set_tensor("advantages", torch::randn({kRows, kResponse}) * mask.to(torch::kFloat));
    batch.set_tensor("returns", torch::randn({kRows, kResponse}) * mask.to(torch::kFloat));
    batch_ = new DataProto(batch);
  }
  static void TearDownTestSuite() {
    delete batch_;
    delete host_;
    delete ctl_;
  }

  static torch::Tensor params_of(const std::string& role) {
    return host_->call(role, "flat_parameters", DataProto()).tensor("parameters");
  }

  // The role padded and by tokens in one process (and by tokens on 2 ranks when dp_too), updated on the batch.
  static void expect_same_update(const std::string& type, const std::string& role, const std::string& method,
                                 const std::function<nlohmann::json(int64_t, bool)>& config, bool dp_too = false) {
    host_->create(type, context(role + "_padded", config(4, false)));
    host_->create(type, context(role + "_dynamic", config(4, true)));
    const torch::Tensor initial = params_of(role + "_padded");
    host_->call(role + "_padded", method, *batch_);
    host_->call(role + "_dynamic", method, *batch_);
    const torch::Tensor want = params_of(role + "_padded"), got = params_of(role + "_dynamic");
    EXPECT_GT(max_diff(want, initial), 1e-3) << role << ": the update must move the parameters";
    EXPECT_LT(max_diff(got, want), kTolerance) << role << ": by tokens vs padded";
    if (!dp_too) return;
    // 2 ranks of 2 rows per mini-batch: rank 0 rows 0-1 and 4-5, rank 1 rows 2-3 and 6-7 (as the padded
    // process, which sees each global mini-batch of 4 rows in order, takes them: rows 0-3 then 4-7).
    if (ctl_ == nullptr) {
      ctl_ = new Controller();
      ResourcePool p;
      p.name = "dp";
      p.num_processes = 2;
      p.call_timeout_s = 60;
      p.env["OMP_NUM_THREADS"] = "1";
      p.env["OMP_WAIT_POLICY"] = "passive";
      ctl_->add_pools({p});
    }
    WorkerGroup dp = ctl_->create_group("dp", role + "_dp", type, {}, config(2, true));
    dp.call(method, batch_->index_select(torch::tensor({0, 1, 4, 5, 2, 3, 6, 7}, torch::kLong))).get();
    Future f = dp.call("flat_parameters");
    f.get();
    const torch::Tensor rank0 = f.per_rank().at(0).tensor("parameters"), rank1 = f.per_rank().at(1).tensor("parameters");
    EXPECT_TRUE(torch::equal(rank0, rank1)) << role << ": replicas differ";
    EXPECT_LT(max_diff(rank0, want), kTolerance) << role << ": 2 ranks by tokens vs 1 padded";
  }

  static WorkerHost* host_;
  static Controller* ctl_;
  static DataProto* batch_;
};
WorkerHost* DynamicBatchSize::host_ = nullptr;
Controller* DynamicBatchSize::ctl_ = nullptr;
DataProto* DynamicBatchSize::batch_ = nullptr;

}  // namespace

TEST_F(DynamicBatchSize, LogProbsValuesAndScoresEqualThePaddedPasses) {
  host_->create(kActorRolloutRefWorkerType, context("lp_padded", actor_config(4, "token-mean", false)));
  host_->create(kActorRolloutRefWorkerType, context("lp_dynamic", actor_config(4, "token-mean", true)));
  for (const auto& [method, key] : std::vector<std::pair<std::string, std::string>>{
           {"compute_log_prob", "old_log_probs"}, {"compute_ref_log_prob", "ref_log_prob"}}) {
    const torch::Tensor want = host_->call("lp_padded", method, *batch_).tensor(key);
    const torch::Tensor got = host_->call("lp_dynamic", method, *batch_).tensor(key);
    ASSERT_EQ(got.sizes(), want.sizes()) << key;
    EXPECT_LT(max_diff(got, want), kTolerance) << key;
    EXPECT_GT(want.abs().sum().item<double>(), 1.0) << key;
  }
  host_->create(kCriticWorkerType, context("v_padded", critic_config(4, "token-mean", false)));
  host_->create(kCriticWorkerType, context("v_dynamic", critic_config(4, "token-mean", true)));
  const torch::Tensor want_values = host_->call("v_padded", "compute_values", *batch_).tensor("values");
  EXPECT_LT(max_diff(host_->call("v_dynamic", "compute_values", *batch_).tensor("values"), want_values), kTolerance);
  host_->create(kRewardModelWorkerType, context("rm_padded", rm_config(false)));
  host_->create(kRewardModelWorkerType, context("rm_dynamic", rm_config(true)));
  const torch::Tensor want_scores = host_->call("rm_padded", "compute_rm_score", *batch_).tensor("rm_scores");
  EXPECT_LT(max_diff(host_->call("rm_dynamic", "compute_rm_score", *batch_).tensor("rm_scores"), want_scores),
            kTolerance);
}

TEST_F(DynamicBatchSize, ActorUpdatesEqualThePaddedUpdatesForEveryLossAggMode) {
  for (const std::string agg :
       {"token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"}) {
    expect_same_update(kActorRolloutRefWorkerType, "actor_" + agg, "update_actor",
                       [&](int64_t mini, bool dynamic) { return actor_config(mini, agg, dynamic); },
                       /*dp_too=*/agg == "seq-mean-token-sum-norm");
  }
}

TEST_F(DynamicBatchSize, CriticUpdatesEqualThePaddedUpdates) {
  for (const std::string agg : {"token-mean", "seq-mean-token-sum-norm"}) {
    expect_same_update(kCriticWorkerType, "critic_" + agg, "update_critic",
                       [&](int64_t mini, bool dynamic) { return critic_config(mini, agg, dynamic); });
  }
}

TEST_F(DynamicBatchSize, ABudgetBelowTheLongestSequenceNamesTheKey) {
  nlohmann::json config = actor_config(4, "token-mean", true);
  config["rollout"]["log_prob_max_token_len"] = 5;
  host_->create(kActorRolloutRefWorkerType, context("too_small", config));
  try {
    host_->call("too_small", "compute_log_prob", *batch_);
    FAIL() << "a 5-token budget must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("log_prob_max_token_len_per_gpu"), std::string::npos) << e.what();
  }
}
