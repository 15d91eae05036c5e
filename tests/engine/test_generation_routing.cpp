// Generation's router recording (router replay R3): every token the model read in a rollout, with the
// experts each MoE layer chose for it, and what replaying that routing does to the log-probs of training.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "hybridflow/engine/generation.h"
#include "hybridflow/engine/model_log_probs.h"
#include "hybridflow/model/moe.h"
#include "hybridflow/model/transformer.h"
#include "support/error_of.h"

namespace hybridflow {
namespace {

using ::testing::HasSubstr;
using hybridflow::testing::error_of;

ModelConfig tiny_qwen3_moe() {
  ModelConfig c;
  c.model_type = "qwen3_moe";
  c.architecture = causal_lm_architecture("qwen3_moe");
  c.vocab_size = 40;
  c.hidden_size = 24;
  c.intermediate_size = 30;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.moe.num_experts = 5;
  c.moe.num_experts_per_tok = 2;
  c.moe.moe_intermediate_size = 8;
  c.moe.norm_topk_prob = true;
  return c;
}

class GenerationRouting : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    torch::manual_seed(31);
    model = CausalLM(tiny_qwen3_moe());
    // Router weights large enough that routing depends on the input.
    torch::NoGradGuard no_grad;
    for (auto& item : model->named_parameters())
      if (!item.key().ends_with("norm.weight")) item.value().normal_(0.0, 1.0 / std::sqrt(24.0));
  }
  GenerationConfig config(bool record, bool paged = true) const {
    GenerationConfig g;
    g.max_new_tokens = 7;
    g.n = 2;
    g.seed = 5;
    g.eos_token_ids = {3};
    g.max_num_seqs = 3;  // sequences wait for slots and join a running batch
    g.paged_kv_cache = paged;
    g.kv_block_size = 4;
    g.record_routing = record;
    return g;
  }
  CausalLM model{nullptr};
  std::vector<std::vector<int64_t>> prompts = {{5, 9, 2, 30, 7}, {1, 12}, {20, 4, 33}};
};

struct Sequences {
  torch::Tensor ids, mask;
  int64_t prompt_width = 0, response_width = 0;
};
Sequences sequences_of(const GenerationOutput& out) {
  return {torch::cat({out.prompts, out.responses}, 1), torch::cat({out.prompt_mask, out.response_mask}, 1),
          out.prompts.size(1), out.responses.size(1)};
}

// Response log-probs under the model as it routes now (replay set or not), masked.
torch::Tensor response_log_probs_of(CausalLM& model, const Sequences& s) {
  torch::NoGradGuard no_grad;
  return response_log_probs(model, s.ids, s.mask, s.response_width, 1.0, false).log_probs *
         s.mask.narrow(1, s.prompt_width, s.response_width).to(torch::kFloat32);
}

TEST_F(GenerationRouting, RecordingChangesNoTokenAndCoversEveryTokenTheModelRead) {
  for (bool paged : {true, false}) {
    SCOPED_TRACE(paged ? "paged" : "slots");
    const auto plain = generate(model, prompts, config(false, paged));
    const auto recorded = generate(model, prompts, config(true, paged));
    EXPECT_FALSE(plain.routed_experts.defined());
    EXPECT_TRUE(torch::equal(plain.responses, recorded.responses));
    EXPECT_TRUE(torch::equal(plain.log_probs, recorded.log_probs));
    EXPECT_EQ(model->router_replay_mode(), RouterReplayMode::kOff);
    const auto& routed = recorded.routed_experts;
    const int64_t p = recorded.prompts.size(1), r = recorded.responses.size(1);
    ASSERT_EQ(routed.sizes(), (std::vector<int64_t>{6, p + r, 3, 2}));
    EXPECT_EQ(routed.scalar_type(), torch::kInt32);
    // Read: the real prompt tokens and every response token but the last (sampled, never fed back).
    auto read = torch::cat({recorded.prompt_mask, recorded.response_mask}, 1).to(torch::kBool);
    const auto lengths = recorded.response_mask.sum(1);
    for (int64_t q = 0; q < 6; ++q) read[q][p + lengths[q].item<int64_t>() - 1] = false;
    const auto has = routed.ge(0);
    EXPECT_TRUE(torch::equal(has.all(-1).all(-1), read));
    EXPECT_TRUE(torch::equal(has.any(-1).any(-1), read));
    EXPECT_LT(routed.max().item<int64_t>(), 5);
    // A token's two experts are two.
    const auto two = routed.select(3, 0).ne(routed.select(3, 1));
    EXPECT_TRUE(two.logical_or(read.logical_not().unsqueeze(-1)).all().item<bool>());
  }
}

// Decode steps read back in chunks (readback_interval) record the routing of exactly the tokens the model
// read for each sequence: what rows decode past their eos inside a chunk is discarded with their tokens.
TEST_F(GenerationRouting, ChunkedReadBackRecordsTheSameRouting) {
  for (bool paged : {true, false}) {
    SCOPED_TRACE(paged ? "paged" : "slots");
    GenerationConfig g = config(true, paged);
    const auto every_step = generate(model, prompts, g);
    g.readback_interval = 4;
    const auto chunked = generate(model, prompts, g);
    EXPECT_TRUE(torch::equal(chunked.responses, every_step.responses));
    EXPECT_TRUE(torch::equal(chunked.routed_experts, every_step.routed_experts));
    EXPECT_LT(chunked.host_syncs, every_step.host_syncs);
  }
}

// The decode steps route as one forward over the whole sequence does: the recording matches that
// forward's own routing token for token, and replaying it reproduces the rollout's log-probs.
TEST_F(GenerationRouting, TheRolloutsRoutingIsTheRoutingOfAForwardOverTheSequence) {
  const auto out = generate(model, prompts, config(true));
  const Sequences s = sequences_of(out);
  torch::NoGradGuard no_grad;
  model->set_router_replay(RouterReplayMode::kRecord);
  model->forward(s.ids, s.mask);
  const ExpertRouting own = model->recorded_routing();
  ExpertRouting rollout;
  for (int64_t l = 0; l < 3; ++l) rollout.layers.push_back(out.routed_experts.select(2, l));
  const auto read = out.routed_experts.select(3, 0).select(2, 0).ge(0);
  ExpertRouting own_where_read;
  for (int64_t l = 0; l < 3; ++l)
    own_where_read.layers.push_back(own.layers[l].masked_fill(read.logical_not().unsqueeze(-1), -1));
  EXPECT_EQ(routing_differs(rollout, own_where_read).sum().item<int64_t>(), 0);

  model->set_router_replay(RouterReplayMode::kReplay, rollout);
  const auto replayed = response_log_probs_of(model, s);
  EXPECT_FALSE(model->replay_differs().any().item<bool>());
  model->set_router_replay(RouterReplayMode::kOff);
  EXPECT_LE((replayed - out.log_probs).abs().max().item<double>(), 1e-5);
}

// After the routers move (a policy update), the old-log-prob pass with replay and without it agree on a
// sequence up to its first token whose routing the update changed, and differ from that token on;
// replay_differs() marks that token and none before it.
TEST_F(GenerationRouting, AfterAnUpdateReplayChangesTheLogProbsExactlyFromWhereRoutingDiffers) {
  const auto out = generate(model, prompts, config(true));
  const Sequences s = sequences_of(out);
  torch::NoGradGuard no_grad;
  torch::manual_seed(32);
  for (auto& item : model->named_parameters())
    if (item.key().ends_with("mlp.gate.weight")) item.value().add_(0.01 * torch::randn(item.value().sizes()));
  model->set_router_replay(RouterReplayMode::kRecord);
  model->forward(s.ids, s.mask);
  const ExpertRouting own = model->recorded_routing();
  ExpertRouting rollout, own_where_read;
  const auto read = out.routed_experts.select(3, 0).select(2, 0).ge(0);
  for (int64_t l = 0; l < 3; ++l) {
    rollout.layers.push_back(out.routed_experts.select(2, l));
    own_where_read.layers.push_back(own.layers[l].masked_fill(read.logical_not().unsqueeze(-1), -1));
  }
  const auto differs = routing_differs(rollout, own_where_read);
  model->set_router_replay(RouterReplayMode::kOff);
  const auto own_lp = response_log_probs_of(model, s);
  model->set_router_replay(RouterReplayMode::kReplay, rollout);
  const auto replay_lp = response_log_probs_of(model, s);
  const auto marked = model->replay_differs().logical_and(read);
  model->set_router_replay(RouterReplayMode::kOff);

  std::printf("tokens routed otherwise after the update: %lld of %lld read\n",
              static_cast<long long>(differs.sum().item<int64_t>()),
              static_cast<long long>(read.sum().item<int64_t>()));
  const int64_t p = s.prompt_width, width = s.ids.size(1);
  int64_t rows_changed = 0, rows_same = 0, compared = 0;
  for (int64_t q = 0; q < 6; ++q) {
    auto at = differs[q].nonzero();
    const int64_t first = at.numel() > 0 ? at[0][0].item<int64_t>() : width;
    EXPECT_FALSE(marked[q].narrow(0, 0, first).any().item<bool>()) << q;
    // Response token t is predicted at position p - 1 + t.
    const int64_t length = out.response_mask[q].sum().item<int64_t>();
    int64_t first_changed_t = -1;
    for (int64_t t = 0; t < length; ++t) {
      const double gap = (replay_lp[q][t] - own_lp[q][t]).abs().item<double>();
      if (p - 1 + t < first) {
        ++compared;
        EXPECT_LE(gap, 1e-5) << q << ", " << t;
      } else if (first_changed_t < 0) {
        first_changed_t = t;
        EXPECT_GT(gap, 1e-7) << q << ", " << t;
      }
    }
    if (first == width) {
      ++rows_same;
    } else {
      ++rows_changed;
      EXPECT_TRUE(marked[q][first].item<bool>()) << q;
    }
  }
  EXPECT_GT(compared, 0);
  EXPECT_GT(rows_changed, 0);
  std::printf("rows with a routing change: %lld, without: %lld\n", static_cast<long long>(rows_changed),
              static_cast<long long>(rows_same));
}

TEST_F(GenerationRouting, RecordingNeedsExpertsAndTheContinuousPath) {
  GenerationConfig g = config(true);
  g.continuous_batching = false;
  EXPECT_THAT(error_of([&] { generate(model, prompts, g); }), HasSubstr("continuous batching"));
  ModelConfig dense = tiny_qwen3_moe();
  dense.model_type = "qwen3";
  dense.architecture = causal_lm_architecture("qwen3");
  dense.moe = MoeConfig{};
  CausalLM dense_model(dense);
  EXPECT_THAT(error_of([&] { generate(dense_model, prompts, config(true)); }), HasSubstr("mixture-of-experts"));
}

}  // namespace
}  // namespace hybridflow
