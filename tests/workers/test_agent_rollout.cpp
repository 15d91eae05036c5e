// Agentic rollouts on the generation engine: episodes' turns generated together in rounds, reproducibly, and
// the batch of their trajectories trains only on the sampled ids with the log-probs they were sampled with.
#include "hybridflow/workers/agent_rollout.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <stdexcept>

#include "hybridflow/core/error.h"
#include "hybridflow/agent/command_tool.h"
#include "hybridflow/model/batch_invariant.h"
#include "support/error_of.h"
#include "workers/tool_episodes.h"
#include "support/testdata_dir.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

constexpr int64_t kEos = 3;
using testing::tool_episodes;

// Two runs of one seed drew the same responses with the same log-probs, and not every episode the same response.
void expect_same_sampled_episodes(const std::vector<agent::Trajectory>& a, const std::vector<std::vector<float>>& a_lp,
                                  const std::vector<agent::Trajectory>& b, const std::vector<std::vector<float>>& b_lp) {
  bool some_differ = false;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].response_ids, b[i].response_ids) << "episode " << i;
    EXPECT_EQ(a_lp[i], b_lp[i]) << "episode " << i;
    if (i > 0 && a[i].response_ids != a[0].response_ids) some_differ = true;
  }
  EXPECT_TRUE(some_differ) << "every episode sampled the same response";
}

class AgentRolloutRounds : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    model = testing::spread_logits_model();
    config.temperature = 0.8;
    config.seed = 17;
    config.eos_token_ids = {kEos};
  }

  // Episode i: a prompt of its own, then (i % 3) + 1 assistant turns of at most 6 ids, each but the last
  // followed by a "tool result" of three ids the model did not sample.
  std::vector<agent::Trajectory> run(int64_t episodes, std::vector<std::vector<float>>* log_probs,
                                     TurnRoundStats* stats) {
    std::vector<agent::Trajectory> out(static_cast<size_t>(episodes));
    *log_probs = run_in_turn_rounds(
        episodes,
        [&](int64_t i, const agent::TurnSampler& sample) {
          agent::Trajectory& t = out[static_cast<size_t>(i)];
          t.prompt_ids = {5, static_cast<int32_t>(10 + i), 2};
          for (int64_t k = 0; k < i; ++k) t.prompt_ids.push_back(static_cast<int32_t>(20 + k));
          const int turns = static_cast<int>(i % 3) + 1;
          for (int turn = 0; turn < turns; ++turn) {
            std::vector<int32_t> context = t.prompt_ids;
            context.insert(context.end(), t.response_ids.begin(), t.response_ids.end());
            const std::vector<int32_t> ids = sample(context, turn == 1 ? 4 : 6);
            EXPECT_LE(ids.size(), turn == 1 ? 4U : 6U);
            t.response_ids.insert(t.response_ids.end(), ids.begin(), ids.end());
            t.response_mask.insert(t.response_mask.end(), ids.size(), 1);
            if (turn + 1 == turns) break;
            for (int32_t id : {7, 8, static_cast<int32_t>(30 + i)}) {
              t.response_ids.push_back(id);
              t.response_mask.push_back(0);
            }
          }
        },
        engine_turn_rounds(model, config), stats);
    return out;
  }

  CausalLM model{nullptr};
  GenerationConfig config;
};

TEST_F(AgentRolloutRounds, TurnsOfWaitingEpisodesAreGeneratedTogetherInRounds) {
  std::vector<std::vector<float>> log_probs;
  TurnRoundStats stats;
  const auto trajectories = run(7, &log_probs, &stats);
  // Turns per episode: 1, 2, 3, 1, 2, 3, 1 -> rounds of 7, 4 and 2 turns.
  EXPECT_EQ(stats.rounds, 3);
  EXPECT_EQ(stats.turns, 13);
  EXPECT_EQ(stats.largest_round, 7);
  for (size_t i = 0; i < trajectories.size(); ++i) {
    int64_t sampled = 0;
    for (uint8_t m : trajectories[i].response_mask) sampled += m;
    EXPECT_EQ(static_cast<int64_t>(log_probs[i].size()), sampled) << "episode " << i;
  }
}

TEST_F(AgentRolloutRounds, SameSeedSameTrajectoriesWhateverTheThreadsTiming) {
  std::vector<std::vector<float>> a_lp, b_lp;
  TurnRoundStats stats;
  const auto a = run(6, &a_lp, &stats);
  const auto b = run(6, &b_lp, &stats);
  expect_same_sampled_episodes(a, a_lp, b, b_lp);
}

TEST_F(AgentRolloutRounds, BatchMasksToolIdsAndKeepsTheSampledLogProbs) {
  std::vector<std::vector<float>> log_probs;
  TurnRoundStats stats;
  const auto trajectories = run(6, &log_probs, &stats);
  const int64_t response_length = 24;
  const DataProto batch = agent_rollout_batch(trajectories, log_probs, response_length, /*pad_id=*/0);
  const auto responses = batch.tensor("responses");
  const auto mask = batch.tensor("response_mask");
  const auto rollout_lp = batch.tensor("rollout_log_probs");
  ASSERT_EQ(responses.size(1), response_length);
  for (size_t i = 0; i < trajectories.size(); ++i) {
    const auto row = static_cast<int64_t>(i);
    for (size_t k = 0; k < trajectories[i].response_ids.size(); ++k) {
      const auto at = static_cast<int64_t>(k);
      EXPECT_EQ(responses[row][at].item<int64_t>(), trajectories[i].response_ids[k]);
      EXPECT_EQ(mask[row][at].item<int64_t>(), trajectories[i].response_mask[k]);
    }
  }
  // The tool ids are context, never trained: no mask and no log-prob there.
  EXPECT_TRUE((rollout_lp.masked_select(mask == 0) == 0).all().item<bool>());
  EXPECT_LT(mask.sum().item<int64_t>(), batch.tensor("attention_mask").slice(1, batch.tensor("prompts").size(1)).sum().item<int64_t>());

  // One forward pass over the whole trajectories scores each sampled id as the rounds sampled it.
  torch::NoGradGuard no_grad;
  const int64_t p = batch.tensor("prompts").size(1);
  const auto logits = model->forward(batch.tensor("input_ids"), batch.tensor("attention_mask")).logits.slice(1, p - 1, p - 1 + response_length);
  const auto recomputed =
      torch::log_softmax(logits / config.temperature, -1).gather(-1, responses.unsqueeze(-1)).squeeze(-1) * mask.to(torch::kFloat);
  EXPECT_TRUE(torch::allclose(rollout_lp, recomputed, 1e-4, 1e-4))
      << "max diff " << (rollout_lp - recomputed).abs().max().item<float>();
  EXPECT_TRUE((rollout_lp.masked_select(mask == 1) < 0).all().item<bool>());
}

TEST_F(AgentRolloutRounds, AFailingEpisodeIsRethrownAfterTheOthersEnd) {
  int64_t finished = 0;
  std::mutex m;
  EXPECT_THROW(run_in_turn_rounds(
                   4,
                   [&](int64_t i, const agent::TurnSampler& sample) {
                     sample({1, 2, static_cast<int32_t>(i)}, 3);
                     if (i == 2) throw std::runtime_error("tool crashed");
                     sample({1, 2, static_cast<int32_t>(i), 4}, 3);
                     std::lock_guard<std::mutex> lock(m);
                     ++finished;
                   },
                   engine_turn_rounds(model, config)),
               std::runtime_error);
  EXPECT_EQ(finished, 3);
}

// Greedy: delta prefill on cached prefixes gives the tokens and log-probs of prefilling every turn's whole
// context again (the rounds), bit for bit under the batch-invariant kernels and to float rounding with the
// default ones, for tool results of 1 to 5 ids; and it prefills far fewer positions.
TEST_F(AgentRolloutRounds, ContinuousTurnsWithDeltaPrefillMatchReprefillingEveryTurn) {
  config.greedy = true;
  config.max_new_tokens = 40;  // each episode's response budget
  for (const bool exact : {true, false}) {
    SCOPED_TRACE(exact ? "batch-invariant kernels" : "default kernels");
    BatchInvariantGuard kernels(exact);
    const int64_t episodes = 9;
    std::vector<agent::Trajectory> rounds(episodes), continuous(episodes);
    TurnRoundStats rounds_stats, continuous_stats;
    const auto rounds_lp = run_in_turn_rounds(episodes, tool_episodes(rounds, config.max_new_tokens),
                                              engine_turn_rounds(model, config), &rounds_stats);
    const auto continuous_lp = run_in_continuous_turns(episodes, tool_episodes(continuous, config.max_new_tokens), model,
                                                       config, &continuous_stats);
    int64_t tool_turns = 0;
    for (int64_t i = 0; i < episodes; ++i) {
      const auto at = static_cast<size_t>(i);
      EXPECT_EQ(continuous[at].response_ids, rounds[at].response_ids) << "episode " << i;
      EXPECT_EQ(continuous[at].response_mask, rounds[at].response_mask) << "episode " << i;
      testing::expect_same_log_probs(continuous_lp[at], rounds_lp[at], exact, "episode " + std::to_string(i));
      for (size_t k = 1; k < continuous[at].response_mask.size(); ++k)
        tool_turns += continuous[at].response_mask[k] == 1 && continuous[at].response_mask[k - 1] == 0 ? 1 : 0;
    }
    EXPECT_GE(tool_turns, 6) << "too few turns resumed after a tool result to compare";
    EXPECT_EQ(continuous_stats.turns, rounds_stats.turns);
    EXPECT_GT(continuous_stats.reused_tokens, 0);
    EXPECT_EQ(continuous_stats.prefill_tokens + continuous_stats.reused_tokens, rounds_stats.prefill_tokens);
    EXPECT_LT(continuous_stats.prefill_tokens, rounds_stats.prefill_tokens);
  }
}

// GRPO groups: the n episodes of one prompt share its KV blocks and its prefill. Their trajectories and log-probs
// are those of episodes that share nothing (bit for bit under the batch-invariant kernels, to float rounding
// with the default ones); each group's prompt is prefilled once and the peak of blocks held is lower.
TEST_F(AgentRolloutRounds, AGroupsEpisodesShareTheirPromptAndSampleWhatTheyWouldAlone) {
  config.max_new_tokens = 40;
  const int64_t episodes = 9, n = 3;
  for (const bool exact : {true, false}) {
    SCOPED_TRACE(exact ? "batch-invariant kernels" : "default kernels");
    BatchInvariantGuard kernels(exact);
    std::vector<agent::Trajectory> alone(episodes), shared(episodes);
    TurnRoundStats alone_stats, shared_stats;
    const auto alone_lp = run_in_continuous_turns(episodes, tool_episodes(alone, config.max_new_tokens, n), model, config,
                                                  &alone_stats);
    const auto shared_lp = run_in_continuous_turns(episodes, tool_episodes(shared, config.max_new_tokens, n), model,
                                                   config, &shared_stats, n);
    bool some_differ = false;
    for (size_t i = 0; i < shared.size(); ++i) {
      EXPECT_EQ(shared[i].response_ids, alone[i].response_ids) << "episode " << i;
      testing::expect_same_log_probs(shared_lp[i], alone_lp[i], exact, "episode " + std::to_string(i));
      if (i % n != 0 && shared[i].response_ids != shared[i - i % n].response_ids) some_differ = true;
    }
    EXPECT_TRUE(some_differ) << "a group's episodes all sampled the same response";
    // Prompts of 3 and 8 ids (groups 0, 2 and 1) in blocks of 16: each member after a group's first takes
    // the prompt's positions from the shared prefill and no full block (none is full).
    EXPECT_EQ(shared_stats.shared_prompt_tokens, 2 * (3 + 8 + 3));
    EXPECT_EQ(shared_stats.prefill_tokens + shared_stats.shared_prompt_tokens, alone_stats.prefill_tokens);
    EXPECT_EQ(shared_stats.turns, alone_stats.turns);
  }
  // Blocks of 4: the prompts' full blocks (0, 2 and 0) are held once per group instead of once per episode.
  // (The peak itself depends on when the episodes' threads ask; engine/test_turn_batcher counts it by hand.)
  config.kv_block_size = 4;
  std::vector<agent::Trajectory> shared(episodes);
  TurnRoundStats stats;
  run_in_continuous_turns(episodes, tool_episodes(shared, config.max_new_tokens, n), model, config, &stats, n);
  EXPECT_EQ(stats.shared_prompt_blocks, (n - 1) * 2);
}

// Sampling: the draws depend on the episode, its turn and the token only, so two runs give the same
// trajectories whatever the threads' timing (under the batch-invariant kernels, whose logits do not depend
// on which turns share a step either).
TEST_F(AgentRolloutRounds, ContinuousTurnsAreReproducibleFromTheSeed) {
  config.max_new_tokens = 40;
  BatchInvariantGuard exact;
  std::vector<agent::Trajectory> a(8), b(8);
  const auto a_lp = run_in_continuous_turns(8, tool_episodes(a, config.max_new_tokens), model, config);
  const auto b_lp = run_in_continuous_turns(8, tool_episodes(b, config.max_new_tokens), model, config);
  expect_same_sampled_episodes(a, a_lp, b, b_lp);
}

// Read back in chunks (readback_interval 2, 3, 8): the episodes' trajectories - sampled ids, tool results and
// masks - and log-probs are those of reading back every step, alone and in groups sharing their prompt, with
// fewer reads of the device per decode step.
TEST_F(AgentRolloutRounds, ContinuousTurnsReadBackInChunksSampleWhatEveryStepReadBackSamples) {
  config.max_new_tokens = 40;
  BatchInvariantGuard exact;  // the threads' timing changes which turns share a step
  const int64_t episodes = 9;
  for (const int64_t n : {1, 3}) {
    config.readback_interval = 1;
    std::vector<agent::Trajectory> want(episodes);
    TurnRoundStats want_stats;
    const auto want_lp = run_in_continuous_turns(episodes, tool_episodes(want, config.max_new_tokens, n), model, config,
                                                 &want_stats, n);
    for (const int64_t interval : {2, 3, 8}) {
      SCOPED_TRACE("groups of " + std::to_string(n) + ", readback_interval " + std::to_string(interval));
      config.readback_interval = interval;
      std::vector<agent::Trajectory> got(episodes);
      TurnRoundStats stats;
      const auto got_lp =
          run_in_continuous_turns(episodes, tool_episodes(got, config.max_new_tokens, n), model, config, &stats, n);
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].response_ids, want[i].response_ids) << "episode " << i;
        EXPECT_EQ(got[i].response_mask, want[i].response_mask) << "episode " << i;
        EXPECT_EQ(got_lp[i], want_lp[i]) << "episode " << i;
      }
      EXPECT_EQ(stats.turns, want_stats.turns);
      EXPECT_LT(static_cast<double>(stats.host_syncs) / static_cast<double>(stats.decode_steps),
                static_cast<double>(want_stats.host_syncs) / static_cast<double>(want_stats.decode_steps));
    }
  }
}

// A small budget: episodes stop when the next turn or tool result would not fit (as with rounds), no turn
// asks past the budget, and the rollout ends without an error.
TEST_F(AgentRolloutRounds, ContinuousTurnsStopCleanlyAtTheResponseBudget) {
  config.max_new_tokens = 9;
  config.eos_token_ids = {};  // every turn runs to its limit
  std::vector<agent::Trajectory> out(6);
  TurnRoundStats stats;
  std::vector<std::vector<float>> log_probs;
  ASSERT_NO_THROW(log_probs = run_in_continuous_turns(6, tool_episodes(out, config.max_new_tokens), model, config, &stats));
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_LE(static_cast<int64_t>(out[i].response_ids.size()), config.max_new_tokens) << "episode " << i;
    int64_t sampled = 0;
    for (uint8_t m : out[i].response_mask) sampled += m;
    EXPECT_EQ(static_cast<int64_t>(log_probs[i].size()), sampled);
  }
  // Asking past the budget is an error the episode sees, rethrown after the others end.
  const std::string message = testing::error_of([&] {
    run_in_continuous_turns(
        2,
        [&](int64_t i, const agent::TurnSampler& sample) {
          const std::vector<int32_t> ids = sample({5, 2}, 9);
          std::vector<int32_t> context = {5, 2};
          context.insert(context.end(), ids.begin(), ids.end());
          if (i == 1) sample(context, 2);
        },
        model, config);
  });
  EXPECT_NE(message.find("response budget"), std::string::npos) << message;
}

TEST_F(AgentRolloutRounds, MismatchedLogProbsAreAnError) {
  agent::Trajectory t;
  t.prompt_ids = {1, 2};
  t.response_ids = {4, 5, 6};
  t.response_mask = {1, 0, 1};
  EXPECT_THROW(agent_rollout_batch({t}, {{-0.5F}}, 8, 0), Error);
  EXPECT_THROW(agent_rollout_batch({t}, {{-0.5F, -0.1F}}, 2, 0), Error);
  EXPECT_NO_THROW(agent_rollout_batch({t}, {{-0.5F, -0.1F}}, 8, 0));
}

}  // namespace
}  // namespace hybridflow

// Episodes over the real Qwen3 tokenizer and template, with a real command tool and interaction, whose turns
// a scripted round generator writes (the engine's rounds are tested above on a tiny model, which cannot write
// a tool call).
namespace hybridflow {
namespace {

std::string qwen_dir() { return testing::tokenizer_data_dir() + "/qwen3"; }

class AgentRolloutRows : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(qwen_dir() + "/tokenizer.json"))
        << "no Qwen3 tokenizer in " << testing::tokenizer_data_searched();
    tokenizer = std::make_unique<text::Tokenizer>(text::Tokenizer::from_file(qwen_dir() + "/tokenizer.json"));
    config = std::make_unique<text::TokenizerConfig>(text::TokenizerConfig::load(qwen_dir() + "/tokenizer_config.json"));
    end = *tokenizer->token_to_id("<|im_end|>");
    environment.tools.add(std::make_shared<agent::CommandTool>(
        agent::Json::parse(R"({"type": "function", "function": {"name": "add", "description": "a + b",
          "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                         "required": ["a", "b"]}}})"),
        std::vector<std::string>{"/usr/bin/python3", "-c",
                                 "import json, sys\na = json.load(sys.stdin)\nprint(a['a'] + a['b'])\n"},
        agent::ProcessBounds{20, 4096}, "test"));
    environment.interactions["check"] =
        std::make_shared<agent::AnswerCheckInteraction>("check", 3, "Correct.", "Try again.");
    setup.limits.max_response_tokens = 200;
  }

  // Row "Qk" says scripts[k][t] at its turn t (counted from the assistant turns in its context), each turn's
  // log-probs -(1 + id position) / 100 so that the batch's values can be traced.
  TurnRoundGenerator scripted(const std::vector<std::vector<std::string>>& scripts) {
    return [this, scripts](const std::vector<std::vector<int32_t>>& contexts, const std::vector<int64_t>& limits,
                           int64_t) {
      std::vector<SampledTurn> turns;
      for (size_t q = 0; q < contexts.size(); ++q) {
        const std::string text = tokenizer->decode(contexts[q], false);
        size_t row = 0;
        while (text.find("Q" + std::to_string(row) + ":") == std::string::npos) ++row;
        size_t turn = 0;
        for (size_t at = text.find("<|im_start|>assistant"); at != std::string::npos;
             at = text.find("<|im_start|>assistant", at + 1))
          ++turn;
        SampledTurn t;
        t.ids = tokenizer->encode(scripts.at(row).at(turn - 1), false);
        t.ids.push_back(end);
        if (static_cast<int64_t>(t.ids.size()) > limits[q]) t.ids.resize(static_cast<size_t>(limits[q]));
        for (size_t k = 0; k < t.ids.size(); ++k) t.log_probs.push_back(-static_cast<float>(k + 1) / 100.0F);
        turns.push_back(std::move(t));
      }
      return turns;
    };
  }

  static AgentRolloutRow row(int k, const std::string& question, const std::string& agent) {
    AgentRolloutRow r;
    r.messages = agent::Json::array({{{"role", "user"}, {"content", "Q" + std::to_string(k) + ": " + question}}});
    r.agent_name = agent;
    return r;
  }

  std::unique_ptr<text::Tokenizer> tokenizer;
  std::unique_ptr<text::TokenizerConfig> config;
  int32_t end = 0;
  agent::AgentEnvironment environment;
  agent::EpisodeSetup setup;
};

const std::string kAddCall = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}\n</tool_call>";

TEST_F(AgentRolloutRows, ToolRowsRunToolsSingleTurnRowsDoNotAndTheBatchMasksToolOutput) {
  std::vector<AgentRolloutRow> rows = {row(0, "What is 2+3?", "tool_agent"), row(1, "What is 2+3?", ""),
                                       row(2, "What is 2+3?", "tool_agent"), row(3, "What is 2+3?", "tool_agent")};
  rows[2].interaction_kwargs = {{"name", "check"}, {"ground_truth", "5"}};
  // Every turn the generator returns, by the row that asked (rows are identified by their question).
  std::map<size_t, std::vector<int32_t>> sampled;
  const TurnRoundGenerator script = scripted({{kAddCall, "It is 5."},
                                              {kAddCall},
                                              {"It is 4.", "It is 5."},
                                              {"<tool_call>\n{not json}\n</tool_call>", kAddCall, "5"}});
  const TurnRoundGenerator recording = [&](const std::vector<std::vector<int32_t>>& contexts,
                                           const std::vector<int64_t>& limits, int64_t round) {
    std::vector<SampledTurn> turns = script(contexts, limits, round);
    for (size_t q = 0; q < contexts.size(); ++q) {
      const std::string text = tokenizer->decode(contexts[q], false);
      size_t row = 0;
      while (text.find("Q" + std::to_string(row) + ":") == std::string::npos) ++row;
      sampled[row].insert(sampled[row].end(), turns[q].ids.begin(), turns[q].ids.end());
    }
    return turns;
  };
  const AgentRollout rollout = run_agent_rollout(rows, *tokenizer, *config, environment, setup, recording);
  ASSERT_EQ(rollout.episodes.size(), 4U);
  const auto& tool_row = rollout.episodes[0];
  EXPECT_EQ(tool_row.stats.assistant_turns, 2);
  EXPECT_EQ(tool_row.stats.tool_calls, 1);
  EXPECT_EQ(tool_row.stats.stop, agent::EpisodeStop::answered);
  // The single-turn row's prompt has no tools, and its call is not run.
  const auto& single = rollout.episodes[1];
  EXPECT_EQ(single.stats.assistant_turns, 1);
  EXPECT_EQ(single.stats.tool_calls, 0);
  EXPECT_EQ(tokenizer->decode(single.trajectory.prompt_ids, false).find("<tools>"), std::string::npos);
  EXPECT_NE(tokenizer->decode(tool_row.trajectory.prompt_ids, false).find("<tools>"), std::string::npos);
  const auto& interacted = rollout.episodes[2];
  EXPECT_EQ(interacted.stats.user_turns, 1);
  EXPECT_EQ(interacted.stats.stop, agent::EpisodeStop::interaction_done);
  EXPECT_EQ(rollout.episodes[3].stats.malformed_calls, 1);
  EXPECT_EQ(rollout.episodes[3].stats.assistant_turns, 3);
  EXPECT_EQ(rollout.rounds.rounds, 3);
  EXPECT_EQ(rollout.rounds.largest_round, 4);

  std::vector<agent::Trajectory> trajectories;
  for (const auto& e : rollout.episodes) trajectories.push_back(e.trajectory);
  const DataProto batch = agent_rollout_batch(trajectories, rollout.log_probs, 200, 0);
  const auto mask = batch.tensor("response_mask");
  const auto lp = batch.tensor("rollout_log_probs");
  // The tool's answer "5" sits in the response, unmasked; every sampled id keeps its scripted log-prob.
  const auto& t = tool_row.trajectory;
  std::vector<int32_t> context_ids;
  for (size_t k = 0; k < t.response_ids.size(); ++k)
    if (t.response_mask[k] == 0) context_ids.push_back(t.response_ids[k]);
  EXPECT_NE(tokenizer->decode(context_ids, false).find("<tool_response>\n5"), std::string::npos)
      << tokenizer->decode(context_ids, false);
  for (int64_t i = 0; i < 4; ++i) {
    int64_t in_turn = 0;
    for (int64_t k = 0; k < 200; ++k) {
      if (mask[i][k].item<int64_t>() == 0) {
        in_turn = 0;
        EXPECT_EQ(lp[i][k].item<float>(), 0.0F);
        continue;
      }
      EXPECT_FLOAT_EQ(lp[i][k].item<float>(), -static_cast<float>(++in_turn) / 100.0F) << "row " << i << " at " << k;
    }
  }

  // The ids the loss trains on (response_mask 1) are exactly the ids the generator returned, in order.
  const auto responses = batch.tensor("responses");
  for (int64_t i = 0; i < 4; ++i) {
    std::vector<int32_t> trained;
    for (int64_t k = 0; k < 200; ++k)
      if (mask[i][k].item<int64_t>() == 1) trained.push_back(static_cast<int32_t>(responses[i][k].item<int64_t>()));
    EXPECT_EQ(trained, sampled[static_cast<size_t>(i)]) << "row " << i;
  }

  const nlohmann::json m = agent_rollout_metrics(rollout);
  EXPECT_DOUBLE_EQ(m.at("agent/turns_per_episode").get<double>(), (2 + 1 + 2 + 3) / 4.0);
  EXPECT_DOUBLE_EQ(m.at("agent/tool_calls_per_episode").get<double>(), 2 / 4.0);
  EXPECT_GT(m.at("agent/tool_seconds/add").get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(m.at("agent/tool_timeouts").get<double>(), 0);
  EXPECT_DOUBLE_EQ(m.at("agent/truncated_by_turns").get<double>(), 1);
  EXPECT_DOUBLE_EQ(m.at("agent/truncated_by_length").get<double>(), 0);
  // The same metrics from the episodes' records, as the trainer computes them from the batch.
  std::vector<nlohmann::json> records;
  for (const auto& e : rollout.episodes) records.push_back(agent_episode_record(e));
  EXPECT_EQ(records[0].at("messages").size(), 4U);  // user, assistant (call), tool, assistant
  EXPECT_EQ(records[0].at("messages")[2].at("role"), "tool");
  nlohmann::json from_records = agent_episode_metrics(records);
  for (const auto& [key, value] : from_records.items()) EXPECT_EQ(m.at(key), value) << key;
  EXPECT_DOUBLE_EQ(m.at("agent/tool_calls/add").get<double>(), 2);
  EXPECT_DOUBLE_EQ(m.at("agent/malformed_calls").get<double>(), 1);
  EXPECT_DOUBLE_EQ(m.at("agent/truncated_episodes").get<double>(), 1);  // the single-turn row's unrun call
}

TEST_F(AgentRolloutRows, AnUnknownInteractionNameIsAnError) {
  std::vector<AgentRolloutRow> rows = {row(0, "What is 2+3?", "tool_agent")};
  rows[0].interaction_kwargs = {{"name", "nonesuch"}};
  try {
    run_agent_rollout(rows, *tokenizer, *config, environment, setup, scripted({{"5"}}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nonesuch"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hybridflow

// The worker's path: prompt fields in, one engine-driven episode per sample, the RL batch out. A tiny random
// model over the Qwen3 vocabulary writes no tool call, so each episode is one turn; what is checked is the
// plumbing (rows, samples, fields, log-probs against a full forward pass, metrics).
namespace hybridflow {
namespace {

// The trainer's data.apply_chat_template_kwargs and custom_chat_template travel in the multi-turn spec: the
// worker's runtime renders a conversation's prompt with them (Qwen3 without thinking; a replaced template).
TEST_F(AgentRolloutRows, TheRuntimeRendersWithTheTrainersTemplateSettings) {
  const std::string custom = "{% for m in messages %}<<{{ m.role }}>> {{ m.content }}\n{% endfor %}"
                             "{% if add_generation_prompt %}<<assistant>>{% endif %}";
  for (const bool replace : {false, true}) {
    SCOPED_TRACE(replace ? "custom_chat_template" : "enable_thinking: false");
    nlohmann::json spec = {{"enable", true}, {"tokenizer_dir", qwen_dir()},
                           {"chat_template_kwargs", {{"enable_thinking", false}}}};
    if (replace) spec["chat_template"] = custom;
    const AgentRolloutRuntime runtime(spec);
    const AgentRolloutContext& c = runtime.context();
    agent::EpisodeSetup run_setup = c.setup;
    run_setup.limits.max_response_tokens = 200;
    const TurnRoundGenerator answer_five = [this](const std::vector<std::vector<int32_t>>& contexts,
                                                  const std::vector<int64_t>&, int64_t) {
      SampledTurn t;
      t.ids = tokenizer->encode("5", false);
      t.ids.push_back(end);
      t.log_probs.assign(t.ids.size(), -0.5F);
      return std::vector<SampledTurn>(contexts.size(), t);
    };
    const AgentRollout out = run_agent_rollout({row(0, "2+3?", "")}, *c.tokenizer, *c.tokenizer_config,
                                               *c.environment, run_setup, answer_five);
    const std::string prompt = tokenizer->decode(out.episodes.at(0).trajectory.prompt_ids, false);
    if (replace) {
      EXPECT_EQ(prompt, "<<user>> Q0: 2+3?\n<<assistant>>");
    } else {
      EXPECT_EQ(prompt, "<|im_start|>user\nQ0: 2+3?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    }
  }
}

TEST_F(AgentRolloutRows, GenerateSequencesRunsOneEpisodePerSampleOnTheEngine) {
  torch::manual_seed(3);
  at::set_num_threads(1);
  CausalLM model(testing::tiny_model_config(
      {.vocab_size = tokenizer->vocab_size(), .hidden_size = 16, .intermediate_size = 32, .num_hidden_layers = 1},
      "qwen2-tiny"));
  GenerationConfig g;
  g.max_new_tokens = 6;
  g.n = 2;
  g.seed = 9;
  g.temperature = 0.9;
  g.eos_token_ids = {end};
  DataProto prompts;
  prompts.set_field("messages", {nlohmann::json::array({{{"role", "user"}, {"content", "Q0: 2+3?"}}}),
                                 nlohmann::json("Q1: 4+4?")});
  prompts.set_field("agent_name", {nlohmann::json("tool_agent"), nlohmann::json(nullptr)});
  prompts.set_field("answer", {nlohmann::json("5"), nlohmann::json("8")});
  AgentRolloutContext context{tokenizer.get(), config.get(), &environment, setup};
  const DataProto batch = agent_generate_sequences(model, g, prompts, context);
  ASSERT_EQ(batch.batch_size(), 4);
  EXPECT_EQ(batch.field("answer")[1].get<std::string>(), "5");
  EXPECT_EQ(batch.field("answer")[2].get<std::string>(), "8");
  const auto responses = batch.tensor("responses");
  EXPECT_EQ(responses.size(1), 6);
  EXPECT_FALSE(torch::equal(responses[0], responses[1])) << "a prompt's two samples drew the same tokens";
  // The tool row was prompted with the tools, the single-turn row without.
  const auto prompt_ids = batch.tensor("prompts");
  const auto prompt_mask = batch.tensor("attention_mask").slice(1, 0, prompt_ids.size(1));
  EXPECT_GT(prompt_mask[0].sum().item<int64_t>(), prompt_mask[2].sum().item<int64_t>() + 50);

  torch::NoGradGuard no_grad;
  const int64_t p = prompt_ids.size(1);
  const auto mask = batch.tensor("response_mask");
  const auto logits = model->forward(batch.tensor("input_ids"), batch.tensor("attention_mask")).logits.slice(1, p - 1, p + 5);
  const auto recomputed =
      torch::log_softmax(logits / g.temperature, -1).gather(-1, responses.unsqueeze(-1)).squeeze(-1) * mask.to(torch::kFloat);
  EXPECT_TRUE(torch::allclose(batch.tensor("rollout_log_probs"), recomputed, 1e-4, 1e-4));
  // Continuous batching of turns (the model is whole in this process): each prompt was prefilled once for its
  // two episodes, the second taking its positions from that prefill; nothing was resumed.
  const auto& agent_meta = batch.meta().at("agent");
  EXPECT_FALSE(agent_meta.contains("agent/rounds"));
  EXPECT_GT(agent_meta.at("agent/decode_steps").get<int64_t>(), 0);
  EXPECT_EQ(agent_meta.at("agent/reused_prefix_tokens").get<int64_t>(), 0);
  const int64_t prompt_positions = batch.tensor("attention_mask").slice(1, 0, p).sum().item<int64_t>();
  EXPECT_EQ(agent_meta.at("agent/prefill_tokens").get<int64_t>(), prompt_positions / 2);
  EXPECT_EQ(agent_meta.at("agent/shared_prompt_tokens").get<int64_t>(), prompt_positions / 2);
  EXPECT_DOUBLE_EQ(batch.meta().at("agent").at("agent/turns_per_episode").get<double>(), 1.0);
}

}  // namespace
}  // namespace hybridflow
