// TrainEngine's data-parallel step without processes: two engines in two threads sum their buffers
// through an in-memory reducer. Each loss_agg_mode, with the weighting loss_weighting_for gives it, must
// reproduce the one-engine step on the whole mini-batch, also when one rank's share has no valid token.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "hybridflow/algo/masked.h"
#include "hybridflow/engine/train_engine.h"
#include "hybridflow/workers/ppo_epochs.h"

using namespace hybridflow;

namespace {

// Sums the buffers of `ranks` threads: each call blocks until every rank has deposited its buffer.
class ThreadReducer {
 public:
  explicit ThreadReducer(int ranks) : ranks_(ranks) {}
  void reduce(torch::Tensor& t) {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t round = round_;
    sum_ = sum_.defined() ? sum_ + t : t.clone();
    if (++arrived_ == ranks_) {
      result_ = sum_;
      sum_ = torch::Tensor();
      arrived_ = 0;
      ++round_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return round_ != round; });
    }
    t.copy_(result_);
  }

 private:
  int ranks_;
  std::mutex mutex_;
  std::condition_variable cv_;
  torch::Tensor sum_, result_;
  int arrived_ = 0;
  int64_t round_ = 0;
};

std::shared_ptr<torch::nn::LinearImpl> model() {
  torch::manual_seed(7);
  return std::make_shared<torch::nn::LinearImpl>(4, 1);
}

OptimizerOptions options() {
  OptimizerOptions o;
  o.schedule.lr = 0.1;
  o.grad_clip = 0.0;  // clipping would hide a wrongly scaled gradient
  return o;
}

// 8 rows x 5 tokens; rows 4..7 (rank 1's share) all padding when `rank1_empty`.
DataProto batch(bool rank1_empty) {
  torch::manual_seed(3);
  DataProto b;
  b.set_tensor("x", torch::randn({8, 5, 4}));
  b.set_tensor("y", torch::randn({8, 5}));
  auto mask = (torch::rand({8, 5}) > 0.3).to(torch::kLong);
  mask.select(1, 0).fill_(1);
  if (rank1_empty) mask.slice(0, 4).zero_();
  b.set_tensor("response_mask", mask);
  return b;
}

MicroLossFn loss_of(torch::nn::LinearImpl& m, algo::LossAggMode mode) {
  return [&m, mode](const DataProto& d) {
    auto token_loss = (m.forward(d.tensor("x")).squeeze(-1) - d.tensor("y")).pow(2);
    return algo::agg_loss(token_loss, d.tensor("response_mask").to(torch::kFloat), mode);
  };
}

struct Case {
  algo::LossAggMode mode;
  bool rank1_empty;
};

}  // namespace

TEST(TrainEngineDataParallel, TwoRanksTakeTheOneEngineStep) {
  const std::vector<Case> cases = {{algo::LossAggMode::kTokenMean, false},
                                   {algo::LossAggMode::kTokenMean, true},
                                   {algo::LossAggMode::kSeqMeanTokenMean, false},
                                   {algo::LossAggMode::kSeqMeanTokenSum, true},
                                   {algo::LossAggMode::kSeqMeanTokenSumNorm, false},
                                   {algo::LossAggMode::kSeqMeanTokenSumNorm, true},
                                   {algo::LossAggMode::kTokenSum, false}};
  for (const Case& c : cases) {
    const std::string what = algo::to_string(c.mode) + (c.rank1_empty ? " (rank 1 without tokens)" : "");
    const LossWeighting weighting = loss_weighting_for(c.mode);
    const DataProto b = batch(c.rank1_empty);
    auto one = model();
    TrainEngine engine(one, options());
    // The whole mini-batch in one micro-batch: the loss aggregated exactly as the mode defines it.
    const StepStats ref = engine.train_step(b, 8, loss_of(*one, c.mode), "response_mask", weighting);

    ThreadReducer reducer(2);
    std::vector<std::shared_ptr<torch::nn::LinearImpl>> replicas = {model(), model()};
    std::vector<StepStats> stats(2);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < 2; ++rank) {
      threads.emplace_back([&, rank] {
        TrainEngine e(replicas[rank], options());
        e.set_gradient_reducer([&](torch::Tensor& t) { reducer.reduce(t); });
        stats[rank] = e.train_step(b.slice(4 * rank, 4 * rank + 4), 2, loss_of(*replicas[rank], c.mode),
                                   "response_mask", weighting);
      });
    }
    for (auto& t : threads) t.join();

    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_NEAR(stats[rank].loss, ref.loss, 1e-5) << what;
      EXPECT_NEAR(stats[rank].grad_norm, ref.grad_norm, 1e-5) << what;
      EXPECT_EQ(stats[rank].tokens, ref.tokens) << what;
      EXPECT_TRUE(torch::allclose(replicas[rank]->weight, one->weight, 1e-5, 1e-6)) << what;
      EXPECT_TRUE(torch::allclose(replicas[rank]->bias, one->bias, 1e-5, 1e-6)) << what;
    }
    EXPECT_TRUE(torch::equal(replicas[0]->weight, replicas[1]->weight)) << what;
  }
}

// A mini-batch whose mask selects no token (rollout rejection can drop all of one) has nothing to learn
// from: the step is skipped, reported as empty, and the weights and the optimizer's step stay as they were.
TEST(TrainEngineDataParallel, OneEngineWithoutTokensSkipsItsStep) {
  auto m = model();
  TrainEngine engine(m, options());
  DataProto b = batch(true).slice(4, 8);
  const torch::Tensor before = m->weight.detach().clone();
  const StepStats stats = engine.train_step(b, 2, loss_of(*m, algo::LossAggMode::kTokenMean), "response_mask");
  EXPECT_TRUE(stats.empty);
  EXPECT_FALSE(stats.skipped);
  EXPECT_EQ(stats.tokens, 0);
  EXPECT_EQ(stats.step, 0);
  EXPECT_TRUE(torch::equal(m->weight, before));
}
