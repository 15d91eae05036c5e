#include "hybridflow/parallel/tensor_parallel.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hybridflow/core/error.h"
#include "parallel/rank_processes.h"

namespace hybridflow {
namespace {

using testing::gloo_world;
using testing::run_ranks;

TEST(TensorParallel, EvenPartitionNamesTheKeyThatDoesNotDivide) {
  const Partition p = even_partition(12, 4, 2, "num_attention_heads");
  EXPECT_EQ(p.start, 6);
  EXPECT_EQ(p.length, 3);
  try {
    even_partition(10, 4, 0, "num_attention_heads");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_attention_heads = 10"), std::string::npos) << e.what();
  }
}

TEST(TensorParallel, OneProcessIsTheIdentity) {
  TensorParallelGroup tp;
  EXPECT_FALSE(tp.enabled());
  auto x = torch::randn({2, 3});
  EXPECT_TRUE(copy_to_tensor_parallel(x, tp).is_same(x));
  EXPECT_TRUE(reduce_from_tensor_parallel(x, tp).is_same(x));
  EXPECT_TRUE(gather_from_tensor_parallel(x, tp).is_same(x));
}

// Region boundaries: forward values and the gradients autograd sends back through them.
TEST(TensorParallel, RegionCollectivesForwardAndBackward) {
  run_ranks(2, [](int rank, int port) {
    Communicator comm(gloo_world(rank, 2, port));
    TensorParallelGroup tp(&comm);
    auto x = torch::full({3}, static_cast<float>(rank + 1)).set_requires_grad(true);

    auto copied = copy_to_tensor_parallel(x, tp);
    EXPECT_TRUE(torch::equal(copied, x.detach()));
    (copied * static_cast<float>(rank + 1)).sum().backward();  // partial gradients 1 and 2: summed to 3
    EXPECT_TRUE(torch::allclose(x.grad(), torch::full({3}, 3.0f))) << x.grad();

    x.mutable_grad() = torch::Tensor();
    auto reduced = reduce_from_tensor_parallel(x, tp);
    EXPECT_TRUE(torch::allclose(reduced, torch::full({3}, 3.0f)));
    (reduced * 5.0f).sum().backward();  // the replicated output's gradient passes through unchanged
    EXPECT_TRUE(torch::allclose(x.grad(), torch::full({3}, 5.0f)));

    x.mutable_grad() = torch::Tensor();
    auto gathered = gather_from_tensor_parallel(x.view({1, 3}), tp);
    ASSERT_EQ(gathered.sizes(), (at::IntArrayRef{1, 6}));
    EXPECT_TRUE(torch::allclose(gathered, torch::tensor({{1.f, 1.f, 1.f, 2.f, 2.f, 2.f}})));
    (gathered * torch::arange(6, torch::kFloat)).sum().backward();  // each rank gets its slice of the gradient
    EXPECT_TRUE(torch::allclose(x.grad(), torch::arange(3 * rank, 3 * rank + 3, torch::kFloat)));
  });
}

// Vocabulary-parallel log-probs and entropy equal log_softmax over the whole vocabulary, and so do their
// gradients with respect to each rank's slice of the logits; three ranks, targets in every slice.
TEST(TensorParallel, VocabParallelLogProbsAndEntropyMatchTheWholeVocabulary) {
  run_ranks(3, [](int rank, int port) {
    Communicator comm(gloo_world(rank, 3, port));
    TensorParallelGroup tp(&comm);
    torch::manual_seed(7);
    auto logits = (torch::randn({2, 5, 12}) * 4).set_requires_grad(true);  // identical on every rank
    auto targets = torch::randint(0, 12, {2, 5}, torch::kLong);
    auto weights = torch::randn({2, 5});
    auto log_p = torch::log_softmax(logits, -1);
    auto full_lp = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1);
    auto full_h = -(log_p.exp() * log_p).sum(-1);
    ((full_lp * weights).sum() + (full_h * weights).sum() * 0.3).backward();
    auto full_grad = logits.grad().narrow(-1, 4 * rank, 4);

    auto local = logits.detach().narrow(-1, 4 * rank, 4).clone().set_requires_grad(true);
    auto lp = vocab_parallel_log_probs(local, targets, tp);
    auto h = vocab_parallel_entropy(local, tp);
    EXPECT_TRUE(torch::allclose(lp, full_lp, 1e-5, 1e-5)) << (lp - full_lp).abs().max();
    EXPECT_TRUE(torch::allclose(h, full_h, 1e-5, 1e-5)) << (h - full_h).abs().max();
    ((lp * weights).sum() + (h * weights).sum() * 0.3).backward();
    EXPECT_TRUE(torch::allclose(local.grad(), full_grad, 1e-5, 1e-5)) << (local.grad() - full_grad).abs().max();
  });
}

}  // namespace
}  // namespace hybridflow
