// Streaming in the continuous-batching generator: prompts admitted between decoding rounds as slots free
// (GenerationConfig::next_prompts) and each prompt's group of samples handed out as soon as its last sample
// ends (GenerationConfig::on_group_finished), with the versions that drew them.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#include "hybridflow/core/error.h"
#include "hybridflow/engine/generation.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

const std::vector<std::vector<int64_t>> kStreamPrompts = {{5, 9, 2, 30, 7}, {1, 12},     {40, 3, 3, 8},
                                                          {8},              {22, 6, 17}, {4, 4, 19, 2, 9, 11}};

// Two samples a prompt; eos ids 3 and 7 are drawn often enough that responses differ in length.
GenerationConfig stream_config(bool paged, int64_t slots) {
  return GenerationConfig{.max_new_tokens = 14, .temperature = 1.2, .n = 2, .seed = 23, .eos_token_ids = {3, 7},
                          .max_num_seqs = slots, .paged_kv_cache = paged, .kv_block_size = 4};
}

int64_t response_length(const GenerationOutput& out, int64_t row) { return out.response_mask[row].sum().item<int64_t>(); }

std::vector<int64_t> response_of(const GenerationOutput& out, int64_t row) {
  const int64_t len = response_length(out, row);
  const auto r = out.responses[row].slice(0, 0, len).contiguous();
  return {r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + len};
}

// Each group holds exactly its prompt's rows of the output, once, and with every sequence starting at the
// same round (all slots at once) the groups come out in the order of their longest sample: as they end.
TEST(StreamGeneration, GroupsComeOutWholeAsTheyEnd) {
  CausalLM model = testing::spread_logits_model();
  for (bool paged : {false, true}) {
    SCOPED_TRACE("paged " + std::to_string(paged));
    GenerationConfig cfg = stream_config(paged, 0);
    std::vector<FinishedGroup> groups;
    cfg.on_group_finished = [&groups](FinishedGroup&& g) { groups.push_back(std::move(g)); };
    const GenerationOutput out = generate(model, kStreamPrompts, cfg);
    ASSERT_EQ(groups.size(), kStreamPrompts.size());
    std::vector<int64_t> seen;
    int64_t previous_longest = 0;
    bool lengths_differ = false;
    for (const FinishedGroup& g : groups) {
      seen.push_back(g.prompt);
      ASSERT_EQ(g.tokens.size(), 2u);
      EXPECT_TRUE(g.versions.empty() && g.begin_versions.empty());
      int64_t longest = 0;
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t q = g.prompt * 2 + j;
        EXPECT_EQ(g.tokens[static_cast<size_t>(j)], response_of(out, q)) << "prompt " << g.prompt;
        ASSERT_EQ(g.log_probs[static_cast<size_t>(j)].size(), g.tokens[static_cast<size_t>(j)].size());
        for (size_t t = 0; t < g.log_probs[static_cast<size_t>(j)].size(); ++t)
          EXPECT_EQ(g.log_probs[static_cast<size_t>(j)][t], out.log_probs[q][static_cast<int64_t>(t)].item<float>());
        longest = std::max(longest, static_cast<int64_t>(g.tokens[static_cast<size_t>(j)].size()));
      }
      EXPECT_GE(longest, previous_longest) << "prompt " << g.prompt << " came out after a group that ended later";
      lengths_differ = lengths_differ || longest != previous_longest;
      previous_longest = longest;
    }
    EXPECT_TRUE(lengths_differ);
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  }
}

// Prompts streamed in as slots free, each drawing as row first_sequence + j of a call seeded `seed`: the
// run equals the batch-at-a-time generation of all prompts token for token, the prompts are admitted while
// others still decode, and a prompt streamed with its own seed and first_sequence 0 draws what it draws
// generated alone. Log-probs agree within rounding: the rows share their matmuls with different neighbours.
TEST(StreamGeneration, StreamedPromptsDrawWhatTheyDrawInTheirOwnBatch) {
  CausalLM model = testing::spread_logits_model();
  for (bool paged : {false, true}) {
    SCOPED_TRACE("paged " + std::to_string(paged));
    GenerationConfig batch_cfg = stream_config(paged, 4);
    const GenerationOutput batch = generate(model, kStreamPrompts, batch_cfg);

    GenerationConfig cfg = stream_config(paged, 4);
    cfg.max_prompt_length = 6;
    size_t next = 2;  // the call holds prompts 0 and 1; the rest stream in
    int64_t asked_while_running = 0;
    cfg.next_prompts = [&](int64_t room, bool idle) {
      std::vector<StreamedPrompt> more;
      if (!idle) ++asked_while_running;
      for (int64_t k = 0; k < room && next < kStreamPrompts.size(); ++k, ++next)
        more.push_back({kStreamPrompts[next], cfg.seed, static_cast<int64_t>(next) * cfg.n});
      return more;
    };
    std::vector<int64_t> order;
    cfg.on_group_finished = [&order](FinishedGroup&& g) { order.push_back(g.prompt); };
    const std::vector<std::vector<int64_t>> own(kStreamPrompts.begin(), kStreamPrompts.begin() + 2);
    const GenerationOutput streamed = generate(model, own, cfg);
    EXPECT_EQ(next, kStreamPrompts.size());
    EXPECT_GT(asked_while_running, 0);
    EXPECT_EQ(order.size(), kStreamPrompts.size());
    ASSERT_TRUE(torch::equal(streamed.prompts, batch.prompts));
    ASSERT_EQ(streamed.responses.sizes(), batch.responses.sizes());
    EXPECT_TRUE(torch::equal(streamed.responses, batch.responses));
    EXPECT_TRUE(torch::equal(streamed.response_mask, batch.response_mask));
    EXPECT_TRUE(torch::allclose(streamed.log_probs, batch.log_probs, 1e-4, 1e-4))
        << (streamed.log_probs - batch.log_probs).abs().max().item<float>();

    // Alone: prompt i streamed with seed 99 and first sequence 0 as its only prompt, behind nothing.
    for (size_t i = 0; i < kStreamPrompts.size(); ++i) {
      GenerationConfig alone_cfg = stream_config(paged, 4);
      alone_cfg.seed = 99;
      const GenerationOutput alone = generate(model, {kStreamPrompts[i]}, alone_cfg);
      GenerationConfig one = stream_config(paged, 4);
      one.max_prompt_length = 6;
      bool given = false;
      one.next_prompts = [&](int64_t, bool) {
        std::vector<StreamedPrompt> more;
        if (!given) more.push_back({kStreamPrompts[i], 99, 0});
        given = true;
        return more;
      };
      // Behind it: two prompts of the call, drawn with the call's seed 23.
      const GenerationOutput mixed = generate(model, own, one);
      for (int64_t j = 0; j < 2; ++j)
        EXPECT_EQ(response_of(mixed, 4 + j), response_of(alone, j)) << "prompt " << i << " sample " << j;
    }
  }
}

// A source that answers only when the generator is idle runs its prompts one group at a time; an empty
// answer then ends the call.
TEST(StreamGeneration, AnIdleSourceEndsTheCallWithAnEmptyAnswer) {
  CausalLM model = testing::spread_logits_model();
  GenerationConfig cfg = stream_config(true, 4);
  cfg.max_prompt_length = 6;
  size_t next = 0;
  int64_t idle_calls = 0;
  cfg.next_prompts = [&](int64_t, bool idle) {
    std::vector<StreamedPrompt> more;
    if (!idle) return more;
    ++idle_calls;
    if (next < 3) {
      more.push_back({kStreamPrompts[next], cfg.seed, static_cast<int64_t>(next) * cfg.n});
      ++next;
    }
    return more;
  };
  std::vector<int64_t> order;
  cfg.on_group_finished = [&order](FinishedGroup&& g) { order.push_back(g.prompt); };
  const GenerationOutput out = generate(model, {}, cfg);
  EXPECT_EQ(idle_calls, 4);
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2}));  // one at a time: in admission order
  EXPECT_EQ(out.responses.size(0), 6);
  const std::vector<std::vector<int64_t>> first(kStreamPrompts.begin(), kStreamPrompts.begin() + 3);
  const GenerationOutput batch = generate(model, first, stream_config(true, 4));
  EXPECT_TRUE(torch::equal(out.responses, batch.responses));
}

// With partial rollouts the groups carry each token's version and the version that began each sample, the
// same as the output's token_versions.
TEST(StreamGeneration, GroupsCarryTheVersionsThatDrewThem) {
  CausalLM model = testing::spread_logits_model();
  GenerationConfig cfg = stream_config(true, 4);
  cfg.max_prompt_length = 6;
  int rounds = 0;
  cfg.refresh_weights = [&rounds] { return ++rounds >= 6 ? int64_t{4} : int64_t{3}; };
  size_t next = 1;
  cfg.next_prompts = [&](int64_t room, bool) {
    std::vector<StreamedPrompt> more;
    for (int64_t k = 0; k < room && next < kStreamPrompts.size(); ++k, ++next)
      more.push_back({kStreamPrompts[next], cfg.seed, static_cast<int64_t>(next) * cfg.n});
    return more;
  };
  std::map<int64_t, FinishedGroup> groups;
  cfg.on_group_finished = [&groups](FinishedGroup&& g) { groups[g.prompt] = std::move(g); };
  const GenerationOutput out = generate(model, {kStreamPrompts[0]}, cfg);
  ASSERT_EQ(groups.size(), kStreamPrompts.size());
  bool began_old = false, began_new = false;
  for (const auto& [p, g] : groups) {
    for (int64_t j = 0; j < 2; ++j) {
      const int64_t q = p * 2 + j;
      const auto& v = g.versions[static_cast<size_t>(j)];
      ASSERT_EQ(v.size(), g.tokens[static_cast<size_t>(j)].size());
      for (size_t t = 0; t < v.size(); ++t) EXPECT_EQ(v[t], out.token_versions[q][static_cast<int64_t>(t)].item<int64_t>());
      EXPECT_EQ(g.begin_versions[static_cast<size_t>(j)], v.front());
      began_old = began_old || v.front() == 3;
      began_new = began_new || v.front() == 4;
    }
  }
  EXPECT_TRUE(began_old && began_new);  // prompts admitted after the switch begin on the new weights
}

// A streamed generation stopped once three groups ended, then a second call that streams every prompt again,
// each with what the first drew (StreamedPrompt::saved): the unfinished samples continue from their prefixes
// and every prompt ends with the tokens of one uninterrupted run; a group whose samples had all ended is handed
// out again at once, as it was.
TEST(StreamGeneration, StreamedPromptsContinueWhatAStoppedCallDrew) {
  CausalLM model = testing::spread_logits_model();
  for (bool paged : {false, true}) {
    SCOPED_TRACE("paged " + std::to_string(paged));
    const GenerationOutput straight = generate(model, kStreamPrompts, stream_config(paged, 4));

    // Every prompt at the first ask, as row p*n of a call seeded as the straight one.
    auto streaming = [&](std::vector<PartialSequences> saved) {
      GenerationConfig cfg = stream_config(paged, 4);
      cfg.max_prompt_length = 6;
      cfg.next_prompts = [seed = cfg.seed, n = cfg.n, saved = std::move(saved), asked = false](int64_t, bool) mutable {
        std::vector<StreamedPrompt> more;
        for (size_t p = 0; p < kStreamPrompts.size() && !asked; ++p)
          more.push_back({kStreamPrompts[p], seed, static_cast<int64_t>(p) * n, saved.empty() ? PartialSequences{} : saved[p]});
        asked = true;
        return more;
      };
      return cfg;
    };
    GenerationConfig first_cfg = streaming({});
    std::vector<FinishedGroup> ended;
    first_cfg.on_group_finished = [&ended](FinishedGroup&& g) { ended.push_back(std::move(g)); };
    first_cfg.stop_requested = [&ended] { return ended.size() >= 3; };
    const GenerationOutput first = generate(model, {}, first_cfg);
    ASSERT_TRUE(first.stopped);
    ASSERT_EQ(ended.size(), 3u);

    std::vector<PartialSequences> saved(kStreamPrompts.size());
    int64_t begun_unfinished = 0;
    for (size_t p = 0; p < kStreamPrompts.size(); ++p)
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t q = static_cast<int64_t>(p) * 2 + j;
        const std::vector<int64_t> tokens = response_of(first, q);
        // Marked, so that what the second call took from the saved state shows in its output.
        std::vector<float> lp;
        for (size_t t = 0; t < tokens.size(); ++t) lp.push_back(-100.0f - static_cast<float>(t));
        const bool done = first.finished[q].item<bool>();
        begun_unfinished += !done && !tokens.empty();
        saved[p].tokens.push_back(tokens);
        saved[p].log_probs.push_back(lp);
        saved[p].finished.push_back(done);
      }
    EXPECT_GT(begun_unfinished, 0) << "the stop left no sample half drawn";

    GenerationConfig second_cfg = streaming(saved);
    std::map<int64_t, FinishedGroup> groups;
    second_cfg.on_group_finished = [&groups](FinishedGroup&& g) { groups[g.prompt] = std::move(g); };
    const GenerationOutput second = generate(model, {}, second_cfg);
    ASSERT_EQ(groups.size(), kStreamPrompts.size());
    EXPECT_TRUE(torch::equal(second.responses, straight.responses));
    EXPECT_TRUE(torch::equal(second.response_mask, straight.response_mask));
    for (size_t p = 0; p < kStreamPrompts.size(); ++p)
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t q = static_cast<int64_t>(p) * 2 + j;
        const auto kept = static_cast<int64_t>(saved[p].tokens[static_cast<size_t>(j)].size());
        for (int64_t t = 0; t < response_length(second, q); ++t)
          if (t < kept)
            EXPECT_EQ(second.log_probs[q][t].item<float>(), -100.0f - static_cast<float>(t)) << "sequence " << q;
          else
            EXPECT_GT(second.log_probs[q][t].item<float>(), -50.0f) << "sequence " << q << " token " << t;
      }
    for (const FinishedGroup& g : ended) {
      EXPECT_EQ(groups.at(g.prompt).tokens, g.tokens) << "prompt " << g.prompt << " ended in the first call";
      EXPECT_EQ(groups.at(g.prompt).log_probs[0].front(), -100.0f) << "prompt " << g.prompt << " was drawn again";
    }
  }
}

TEST(StreamGeneration, RefusesTooLongPromptsAndTheStaticPath) {
  CausalLM model = testing::spread_logits_model();
  GenerationConfig cfg = stream_config(true, 4);
  cfg.max_prompt_length = 3;
  cfg.next_prompts = [](int64_t, bool idle) {
    std::vector<StreamedPrompt> more;
    if (idle) more.push_back({{1, 2, 3, 4}, 0, 0});
    return more;
  };
  EXPECT_THROW(generate(model, {{5}}, cfg), Error);
  cfg.continuous_batching = false;
  EXPECT_THROW(generate(model, {{5}}, cfg), Error);
}

}  // namespace
}  // namespace hybridflow
