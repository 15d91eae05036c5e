// Agentic rollouts on the generation engine: many episodes (agent/agent_loop.h) run at once, each on its own
// thread, and the assistant turns they wait for are generated together in rounds. A round starts when every
// episode still running waits for the model (the others run tools or an interaction meanwhile); its turns are
// one generate() call over the episodes' current ids, rows in episode order, so a run is reproducible from
// its seed whatever the threads' timing.
//
// Two ways to generate the turns. Rounds (run_in_turn_rounds): a round starts when every running episode
// waits for the model and prefills each turn's whole context again; an episode waiting for a tool holds back
// the round it would join. Continuous batching (run_in_continuous_turns, engine/turn_batcher.h): each turn
// starts as soon as its episode asks, resumes from its conversation's cached prefix (only the appended
// ids are prefilled) and decodes beside the turns of the others; the worker uses it whenever generation runs
// with a paged KV cache (in one process, over tensor-parallel ranks or over pipeline stages), and rounds
// otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "hybridflow/agent/agent_loop.h"
#include "hybridflow/agent/multi_turn_config.h"
#include "hybridflow/core/data_proto.h"
#include "hybridflow/engine/generation.h"

namespace hybridflow {

// One sampled assistant turn: its ids and the log-prob of each under the rollout's sampling distribution.
struct SampledTurn {
  std::vector<int32_t> ids;
  std::vector<float> log_probs;
};

// Generates round `round`: contexts[i] continued by at most max_new_tokens[i] ids.
using TurnRoundGenerator = std::function<std::vector<SampledTurn>(
    const std::vector<std::vector<int32_t>>& contexts, const std::vector<int64_t>& max_new_tokens, int64_t round)>;

struct TurnRoundStats {
  int64_t rounds = 0;          // rounds (0 in continuous batching)
  int64_t turns = 0;           // turns generated
  int64_t largest_round = 0;   // the most turns generated together (in a round, or in one decode step)
  int64_t prefill_tokens = 0;  // context positions prefilled (rounds: every turn's whole context)
  int64_t reused_tokens = 0;   // continuous batching: cached positions that resumed turns did not prefill
  int64_t decode_steps = 0;    // continuous batching
  int64_t host_syncs = 0;      // continuous batching: reads of the device's tokens (readback_interval sets them)
  int64_t peak_kv_blocks = 0;  // continuous batching: the most paged-cache blocks held at once
  int64_t shared_prompt_tokens = 0;  // continuous batching: prompt positions a group's episodes did not prefill
  int64_t shared_prompt_blocks = 0;  // continuous batching: full prompt blocks a group's episodes shared
  int64_t prefix_cached_tokens = 0;  // continuous batching: first-context positions found in other prompts' blocks
  int64_t prefill_forwards = 0;  // continuous batching: forwards that prefilled contexts, several turns' each
  int64_t keep_alive_steps = 0;  // continuous batching over ranks: empty schedule steps sent (or received)
                                 // while rank 0 waited for tools
  double generation_seconds = 0;  // wall time spent generating (in rounds, or in the batcher's steps)
};

// Runs `count` episodes and returns, per episode, the log-probs of the ids its sampler returned, in order.
using EpisodeFunction = std::function<void(int64_t, const agent::TurnSampler&)>;
using EpisodeRunner =
    std::function<std::vector<std::vector<float>>(int64_t count, const EpisodeFunction& episode, TurnRoundStats* stats)>;

// Runs episode(i, sampler) for i in [0, count), each on its own thread; every sampler call waits for its
// round. Returns, per episode, the log-probs of the ids its sampler returned, in order. An exception from an
// episode is rethrown (the first by episode index) after every episode ended.
std::vector<std::vector<float>> run_in_turn_rounds(int64_t count,
                                                   const std::function<void(int64_t, const agent::TurnSampler&)>& episode,
                                                   const TurnRoundGenerator& generate_round,
                                                   TurnRoundStats* stats = nullptr);

// Rounds on `model` with `config` (its n is taken as 1 and its max_new_tokens as each round's largest
// request): round r samples with a seed derived from config.seed and r, row q with its own draws.
TurnRoundGenerator engine_turn_rounds(CausalLM& model, const GenerationConfig& config);
EpisodeRunner turn_rounds_runner(TurnRoundGenerator generate_round);

// Runs episode(i, sampler) for i in [0, count), each on its own thread, their turns in continuous batching
// on `model` (engine/turn_batcher.h; the calling thread drives it): a turn starts as soon as its episode
// asks, a conversation's blocks are kept between its turns and freed when its episode returns.
// config.max_new_tokens is each episode's response budget (what it appends after its first context, in all);
// its n is not read. group_size: episodes [k*g, (k+1)*g) are one prompt's (GRPO's n, rows interleaved) and
// share its prompt's KV blocks and prefill (engine/turn_batcher.h); 1: none shared. Token t of episode i's turn
// k is drawn with the uniforms of (config.seed, k * count + i, t), sharing or not. An exception from an episode
// or from generation is rethrown (the first by episode index) after every episode ended.
//
// With a tensor-parallel model, or a pipeline stage (`stages`: the communicator over the model's stages, one
// rank per stage in stage order; nullptr when the model is whole), only rank 0 of the group (tensor-parallel
// rank 0, or stage 0) runs the episodes (so each tool call runs once) and returns their log-probs; every other
// rank runs no episode (`episode` is not called there), repeats rank 0's schedule (engine/turn_schedule.h) and
// returns no log-probs (an empty vector). While no turn runs and rank 0 waits for its episodes (tools), it sends
// the others an empty step at least every `keep_alive`, so that their wait never reaches the collectives'
// timeout. Tensor parallelism and stages together are refused.
inline constexpr std::chrono::milliseconds kTurnScheduleKeepAlive{5000};
std::vector<std::vector<float>> run_in_continuous_turns(int64_t count, const EpisodeFunction& episode, CausalLM& model,
                                                        const GenerationConfig& config, TurnRoundStats* stats = nullptr,
                                                        int64_t group_size = 1, Communicator* stages = nullptr,
                                                        std::chrono::milliseconds keep_alive = kTurnScheduleKeepAlive);
EpisodeRunner continuous_turns_runner(CausalLM& model, const GenerationConfig& config, int64_t group_size = 1,
                                      Communicator* stages = nullptr);

// True when `model` and `config` can generate multi-turn rollouts by continuous batching of turns: a paged KV
// cache with continuous batching, no mid-generation weight refresh and no routing record (the model whole,
// tensor-parallel or a pipeline stage). Otherwise the worker generates in rounds (refused under tensor
// parallelism or stages: the ranks would each run the tools).
bool continuous_turns_apply(CausalLM& model, const GenerationConfig& config);

// The RL batch of finished trajectories, in rollout_batch's layout: prompts left padded, responses right
// padded to response_length, response_mask 1 only on sampled ids (tool and user turns are 0 inside the
// response), attention_mask 1 on every real id, and rollout_log_probs the sampled ids' log-probs (0
// elsewhere). log_probs[i] holds one value per sampled id of trajectories[i], in order.
DataProto agent_rollout_batch(const std::vector<agent::Trajectory>& trajectories,
                              const std::vector<std::vector<float>>& log_probs, int64_t response_length,
                              int64_t pad_id);

// One row of an agentic rollout, from the data (verl's fields): the prompt's messages, the agent that runs it
// ("" or "single_turn_agent": one turn without tools, as a single-turn row; any other name: tools and, when
// interaction_kwargs names one, that interaction), and the row's kwargs for its tools and interaction.
struct AgentRolloutRow {
  agent::Json messages;
  std::string agent_name;
  agent::Json tools_kwargs = agent::Json::object();
  agent::Json interaction_kwargs = agent::Json::object();
};

struct AgentRollout {
  std::vector<agent::Episode> episodes;
  std::vector<std::vector<float>> log_probs;  // per episode: its sampled ids' log-probs, in order
  TurnRoundStats rounds;
};

// One episode per row, their turns generated in rounds. `setup` gives the format, tool options and limits;
// its tools, interaction and kwargs are each row's own (interaction_kwargs.name picks the interaction from
// `environment`; an unknown name is an Error naming it).
AgentRollout run_agent_rollout(const std::vector<AgentRolloutRow>& rows, const text::Tokenizer& tokenizer,
                               const text::TokenizerConfig& tokenizer_config,
                               const agent::AgentEnvironment& environment, const agent::EpisodeSetup& setup,
                               const TurnRoundGenerator& generate_round);
// The same with the episodes' turns generated by `runner` (turn_rounds_runner or continuous_turns_runner).
AgentRollout run_agent_rollout(const std::vector<AgentRolloutRow>& rows, const text::Tokenizer& tokenizer,
                               const text::TokenizerConfig& tokenizer_config,
                               const agent::AgentEnvironment& environment, const agent::EpisodeSetup& setup,
                               const EpisodeRunner& runner);

// The rollout's metrics (prefix agent/): agent_episode_metrics of its episodes, and its rounds.
nlohmann::json agent_rollout_metrics(const AgentRollout& rollout);

// One episode as the batch's per-sample field "agent_episode": turns, user_turns, tool_calls, tool_errors,
// malformed_calls, sampled_tokens, appended_tokens, stop (episode_stop_name), tools ({name: {calls, seconds,
// errors: {status: n}}}), interaction_rewards, interaction_error and messages (the whole conversation).
nlohmann::json agent_episode_record(const agent::Episode& episode);

// Metrics over episode records (prefix agent/): turns and user turns per episode, tool calls (in all, per
// episode, per tool), tool errors (in all, per tool, per status as agent/tool_status/<status>, timeouts as
// agent/tool_timeouts), tool seconds (in all, per tool), malformed calls, sampled and appended tokens per
// episode, and episodes by how they stopped (agent/stop/<stop>; agent/truncated_episodes those cut by a
// limit, agent/truncated_by_turns by max_assistant_turns or max_user_turns, agent/truncated_by_length by
// the response length).
nlohmann::json agent_episode_metrics(const std::vector<nlohmann::json>& records);

// The rows of a prompt batch, from its fields (verl's names): "messages" (a message list, or a string taken
// as one user message; absent: "prompt" as one user message), and, where present, "agent_name",
// "tools_kwargs" and "interaction_kwargs" (a row without agent_name is single-turn).
std::vector<AgentRolloutRow> agent_rollout_rows(const DataProto& prompts);

// What a rollout worker holds for multi-turn rollouts; the pointers outlive the calls.
struct AgentRolloutContext {
  const text::Tokenizer* tokenizer = nullptr;
  const text::TokenizerConfig* tokenizer_config = nullptr;
  const agent::AgentEnvironment* environment = nullptr;
  agent::EpisodeSetup setup;  // format, tool options, turn limits (max_response_tokens is g.max_new_tokens)
  // Continuous batching of turns where it applies (continuous_turns_apply); false: rounds always (the
  // benchmark's baseline).
  bool continuous_turns = true;
  // In continuous batching, a prompt's g.n episodes share its KV blocks and prefill; false: each episode holds
  // and prefills its own (the benchmark's baseline).
  bool share_prompt_blocks = true;
};

// generate_sequences with multi-turn on: one episode per sample (g.n per prompt, rows interleaved as
// generate's; a prompt's g.n episodes share its KV blocks), on `model` by continuous batching of turns where it
// applies, else in rounds. `stages`: the communicator over the model's pipeline stages when it is one (as
// run_in_continuous_turns). On a tensor-parallel rank other than 0, or a stage other than 0, it returns an
// empty batch (rank 0's is the replica's). The batch is agent_rollout_batch's with response_length
// g.max_new_tokens, the prompts' fields repeated to their samples, the field "agent_episode" (each sample's
// agent_episode_record) and meta "agent" the rollout's metrics.
DataProto agent_generate_sequences(CausalLM& model, const GenerationConfig& g, const DataProto& prompts,
                                   const AgentRolloutContext& context, Communicator* stages = nullptr);

// What a rollout worker loads for multi-turn rollouts, from RolloutSpec::multi_turn (plain values the trainer
// read and checked): tokenizer_dir (tokenizer.json and tokenizer_config.json with the chat template),
// format ("hermes" | "llama3_json"), max_assistant_turns, max_user_turns, tool_config_path,
// interaction_config_path, max_parallel_calls, max_tool_response_length, tool_response_truncate_side.
class AgentRolloutRuntime {
 public:
  explicit AgentRolloutRuntime(const nlohmann::json& multi_turn);
  AgentRolloutRuntime(const AgentRolloutRuntime&) = delete;
  AgentRolloutRuntime& operator=(const AgentRolloutRuntime&) = delete;
  const AgentRolloutContext& context() const { return context_; }

 private:
  text::Tokenizer tokenizer_;
  text::TokenizerConfig tokenizer_config_;
  agent::AgentEnvironment environment_;
  AgentRolloutContext context_;
};

}  // namespace hybridflow
