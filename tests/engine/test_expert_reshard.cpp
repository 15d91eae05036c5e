// The 3D-HybridEngine's expert step (engine/expert_reshard.h) on a tiny Qwen3-MoE model (2 layers of 4 experts,
// hidden 32, expert width 16, fp32), whose experts take X = 2 layers x 4 experts x 3 projections x 32 x 16 x 4 bytes
// = 49,152 bytes:
// - to rollout expert_parallel_size 1 over n = 2 and 4 ranks, each rank sends and receives (n - 1) / n of X
//   (24,576 and 36,864 bytes), holds X and nothing twice; to n (experts in place), nothing moves and it holds X / n;
// - greedy generation with the experts left split (every decode step exchanging tokens) gives one process's
//   tokens, and log-probs within 1e-5, with rows ending at different steps on different ranks; so does the
//   gathered path;
// - switching back leaves every training weight bit for bit, in the same tensors (the optimizer's), with memory of
//   its own, and a train step after a round trip equals one without it.
// Every rank runs in a forked process over Gloo.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/expert_parallel_fixture.h"
#include "hybridflow/core/error.h"
#include "hybridflow/engine/expert_reshard.h"
#include "hybridflow/engine/generation.h"
#include "parallel/rank_processes.h"

namespace hybridflow {
namespace {

using namespace hybridflow::testing;

constexpr int64_t kExpertBytes = 2 * 4 * 3 * 32 * 16 * 4;  // X: every expert of the model, fp32

// Rank r's prompts: two of different lengths, distinct per rank.
std::vector<std::vector<int64_t>> prompts_of(int rank) {
  std::vector<std::vector<int64_t>> out;
  for (int i = 0; i < 2; ++i) {
    std::vector<int64_t> p;
    for (int t = 0; t < 3 + 2 * i + rank; ++t) p.push_back((7 * rank + 5 * i + 3 * t + 1) % 64);
    out.push_back(p);
  }
  return out;
}

GenerationConfig greedy_config(const std::vector<int64_t>& eos) {
  GenerationConfig g;
  g.greedy = true;
  g.max_new_tokens = 8;
  g.eos_token_ids = eos;
  return g;
}

// An eos token that ends some row early: the third token one process draws for rank 0's first prompt.
std::vector<int64_t> early_eos() {
  CausalLM whole = expert_model();
  const auto out = generate(whole, prompts_of(0), greedy_config({}));
  return {out.responses[0][2].item<int64_t>()};
}

std::map<std::string, torch::Tensor> snapshot(CausalLM& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model->named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

void expect_same_generation(const GenerationOutput& got, const GenerationOutput& want, const std::string& what) {
  ASSERT_TRUE(got.responses.sizes() == want.responses.sizes())
      << what << ": " << got.responses.sizes() << " vs " << want.responses.sizes();
  EXPECT_TRUE(torch::equal(got.responses, want.responses)) << what << ": tokens differ";
  EXPECT_TRUE(torch::equal(got.response_mask, want.response_mask)) << what << ": lengths differ";
  EXPECT_TRUE(torch::allclose(got.log_probs, want.log_probs, 0, 1e-5))
      << what << ": log-probs differ by " << (got.log_probs - want.log_probs).abs().max().item<double>();
}

void check_switches(int ranks) {
  const std::vector<int64_t> eos = early_eos();
  {
    // The case the lockstep is for: some rows end while others of the group go on.
    CausalLM whole = expert_model();
    std::set<int64_t> lengths;
    for (int r = 0; r < ranks; ++r) {
      const auto lens = generate(whole, prompts_of(r), greedy_config(eos)).response_mask.sum(1);
      for (int64_t i = 0; i < lens.size(0); ++i) lengths.insert(lens[i].item<int64_t>());
    }
    ASSERT_GT(lengths.size(), 1u) << "every row of every rank has the same length";
    ASSERT_EQ(*lengths.rbegin(), 8) << "no row runs to max_new_tokens";
  }
  run_ranks(
      ranks,
      [&](int rank, int port) {
        Communicator comm(gloo_world(rank, ranks, port));
        CausalLM whole = expert_model();
        const GenerationOutput want = generate(whole, prompts_of(rank), greedy_config(eos));
        CausalLM train = expert_model();
        train->set_expert_parallel(ExpertParallelGroup(&comm));
        const auto before = snapshot(train);
        std::map<std::string, const c10::TensorImpl*> impls;
        for (const auto& item : train->named_parameters()) impls[item.key()] = item.value().unsafeGetTensorImpl();
        const int64_t replicated = [&] {
          int64_t bytes = 0;
          for (const auto& item : train->named_parameters())
            if (item.key().find(".experts.") == std::string::npos) bytes += item.value().nbytes();
          return bytes;
        }();

        // Rollout expert_parallel_size 1: the experts gathered.
        ExpertReshard gather(train, 1, "actor_rollout_ref.rollout.expert_parallel_size");
        const ReshardStats to_gen = gather.to_generation();
        EXPECT_EQ(to_gen.expert_model_bytes, kExpertBytes);
        EXPECT_EQ(to_gen.expert_bytes_sent, kExpertBytes * (ranks - 1) / ranks);
        EXPECT_EQ(to_gen.expert_bytes_received, kExpertBytes * (ranks - 1) / ranks);
        EXPECT_EQ(to_gen.bytes_sent, to_gen.expert_bytes_sent);  // nothing else moves
        EXPECT_EQ(to_gen.bytes_received, to_gen.expert_bytes_received);
        EXPECT_EQ(to_gen.expert_peak_extra_weight_bytes, kExpertBytes);
        EXPECT_EQ(to_gen.expert_redundant_bytes, 0);
        EXPECT_EQ(to_gen.redundant_bytes, 0);
        EXPECT_EQ(to_gen.replicated_bytes, replicated);
        // Measured against the communicator too: the group's all-gathers carried exactly the rank's own experts.
        EXPECT_EQ(comm.stats().of("all_gather").bytes, kExpertBytes / ranks);
        const auto a2a_before = comm.stats().of("all_to_all").calls;
        expect_same_generation(generate(train, prompts_of(rank), greedy_config(eos)), want, "gathered experts");
        EXPECT_EQ(comm.stats().of("all_to_all").calls, a2a_before);  // each rank alone
        gather.to_training();
        EXPECT_FALSE(train->experts_gathered());
        for (const auto& item : train->named_parameters()) {
          EXPECT_TRUE(torch::equal(item.value(), before.at(item.key()))) << item.key() << " changed";
          EXPECT_EQ(item.value().unsafeGetTensorImpl(), impls.at(item.key())) << item.key() << " is another tensor";
          EXPECT_EQ(item.value().storage().nbytes(), item.value().nbytes()) << item.key() << " shares memory";
        }

        // Rollout expert_parallel_size n: the experts stay; each decode step exchanges tokens with the group.
        ExpertReshard in_place(train, ranks, "actor_rollout_ref.rollout.expert_parallel_size");
        const ReshardStats stay = in_place.to_generation();
        EXPECT_EQ(stay.expert_model_bytes, kExpertBytes);
        EXPECT_EQ(stay.bytes_sent, 0);
        EXPECT_EQ(stay.bytes_received, 0);
        EXPECT_EQ(stay.expert_peak_extra_weight_bytes, kExpertBytes / ranks);
        EXPECT_EQ(stay.redundant_bytes, 0);
        const auto exchanges = comm.stats().of("all_to_all").calls;
        GenerationConfig g = greedy_config(eos);
        expect_same_generation(generate(train, prompts_of(rank), g), want, "expert-parallel decoding");
        EXPECT_GT(comm.stats().of("all_to_all").calls, exchanges);
        // Continuous batching is asked for by default; expert-parallel decoding runs the static batch anyway.
        g.continuous_batching = false;
        expect_same_generation(generate(train, prompts_of(rank), g), want, "expert-parallel decoding, static");
        g.use_kv_cache = false;
        expect_same_generation(generate(train, prompts_of(rank), g), want, "expert-parallel decoding, no cache");
        in_place.to_training();
        for (const auto& item : train->named_parameters())
          EXPECT_TRUE(torch::equal(item.value(), before.at(item.key()))) << item.key() << " changed";
      },
      240);
}

TEST(ExpertReshard, GatherAndInPlaceOverTwoRanksMoveTheHandComputedBytesAndGenerateOneProcessTokens) {
  check_switches(2);
}

TEST(ExpertReshard, GatherAndInPlaceOverFourRanksMoveTheHandComputedBytesAndGenerateOneProcessTokens) {
  check_switches(4);
}

// A train step after a gather round trip equals a step without it: the optimizer still steps the same tensors.
TEST(ExpertReshard, ATrainStepAfterARoundTripEqualsOneWithout) {
  run_ranks(
      2,
      [](int rank, int port) {
        Communicator comm(gloo_world(rank, 2, port));
        auto step = [&](bool round_trip) {
          CausalLM model = expert_model();
          model->set_expert_parallel(ExpertParallelGroup(&comm));
          TrainEngine engine(model.ptr(), parallel_test_optimizer());
          engine.set_gradient_reducer([&](torch::Tensor& t) { comm.all_reduce(t, ReduceOp::kSum); });
          engine.set_expert_parallel(ExpertParallelGroup(&comm), nullptr,
                                     [](const std::string& n) { return n.find(".experts.") != std::string::npos; });
          if (round_trip) {
            ExpertReshard reshard(model, 1, "actor_rollout_ref.rollout.expert_parallel_size");
            reshard.to_generation();
            generate(model, prompts_of(rank), greedy_config({}));
            reshard.to_training();
          }
          const DataProto rows = rl_batch().slice(rank * 2, rank * 2 + 2);
          engine.train_step(rows, 1, [&](const DataProto& m) { return policy_loss(model, m); });
          return snapshot(model);
        };
        const auto plain = step(false), after = step(true);
        for (const auto& [name, t] : plain) EXPECT_TRUE(torch::equal(t, after.at(name))) << name;
      },
      120);
}

TEST(ExpertReshard, AGenerationSizeOtherThanOneOrTheTrainingSizeIsRefusedNamingTheKey) {
  run_ranks(2, [](int rank, int port) {
    Communicator comm(gloo_world(rank, 2, port));
    CausalLM model = expert_model();
    model->set_expert_parallel(ExpertParallelGroup(&comm));
    try {
      ExpertReshard reshard(model, 4, "actor_rollout_ref.rollout.expert_parallel_size");
      ADD_FAILURE() << "rollout expert_parallel_size 4 over a training group of 2 was accepted";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("actor_rollout_ref.rollout.expert_parallel_size = 4 must be 1"));
    }
  });
}

}  // namespace
}  // namespace hybridflow
