#include "hybridflow/workers/agent_rollout.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "hybridflow/core/error.h"
#include "hybridflow/core/steady_seconds.h"
#include "hybridflow/engine/turn_batcher.h"
#include "hybridflow/engine/turn_schedule.h"
#include "hybridflow/parallel/collectives.h"

namespace hybridflow {

namespace {

// The rendezvous of the episodes, each on its own thread, and the thread that generates their turns: an
// episode's sampler posts its request and waits for the reply (or the failure) the generating thread posts.
class EpisodeBoard {
 public:
  struct Request {
    std::vector<int32_t> context;
    int64_t max_new_tokens = 0;
  };

  // Starts episode(i, sampler) for i in [0, count), each on its own thread.
  EpisodeBoard(int64_t count, const EpisodeFunction& episode)
      : requests(static_cast<size_t>(count)),
        replies(static_cast<size_t>(count)),
        turn_failures(static_cast<size_t>(count)),
        running(count),
        wake_(static_cast<size_t>(count)),
        log_probs_(static_cast<size_t>(count)),
        failures_(static_cast<size_t>(count)) {
    threads_.reserve(static_cast<size_t>(count));
    for (size_t i = 0; i < static_cast<size_t>(count); ++i)
      threads_.emplace_back([this, i, &episode] {
        agent::TurnSampler sampler = [this, i](const std::vector<int32_t>& context, int64_t max_new_tokens) {
          return ask(i, context, max_new_tokens);
        };
        try {
          episode(static_cast<int64_t>(i), sampler);
        } catch (...) {
          failures_[i] = std::current_exception();
        }
        std::lock_guard<std::mutex> lock(mutex);
        --running;
        ended.push_back(static_cast<int64_t>(i));
        changed.notify_one();
      });
  }

  // Joins the threads; rethrows the first episode's exception by index, else returns each episode's log-probs.
  std::vector<std::vector<float>> finish() {
    for (auto& t : threads_) t.join();
    threads_.clear();
    for (auto& f : failures_)
      if (f) std::rethrow_exception(f);
    return std::move(log_probs_);
  }

  ~EpisodeBoard() {
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

  // Wakes the episode whose reply or failure was just posted (under the mutex). Each episode waits on its
  // own condition: with dozens of episodes, waking them all for every reply cost more than the decoding.
  void wake(size_t i) { wake_[i].notify_one(); }

  std::mutex mutex;
  std::condition_variable changed;  // the generating thread waits on it: a request, an episode's end
  std::vector<std::optional<Request>> requests;     // per episode: a turn asked for, not yet taken
  std::vector<std::optional<SampledTurn>> replies;  // per episode: its turn, generated
  std::vector<std::exception_ptr> turn_failures;    // per episode: generating its turn failed
  std::vector<int64_t> ended;                       // episodes that returned since the generator last looked
  int64_t asked = 0;                                // requests not yet taken
  int64_t running = 0;                              // episodes that have not returned

 private:
  std::vector<int32_t> ask(size_t i, const std::vector<int32_t>& context, int64_t max_new_tokens) {
    std::unique_lock<std::mutex> lock(mutex);
    requests[i] = Request{context, max_new_tokens};
    ++asked;
    changed.notify_one();
    wake_[i].wait(lock, [&] { return replies[i].has_value() || turn_failures[i]; });
    if (turn_failures[i]) std::rethrow_exception(std::exchange(turn_failures[i], nullptr));
    SampledTurn turn = std::move(*replies[i]);
    replies[i].reset();
    lock.unlock();
    log_probs_[i].insert(log_probs_[i].end(), turn.log_probs.begin(), turn.log_probs.end());
    return turn.ids;
  }

  std::vector<std::condition_variable> wake_;
  std::vector<std::vector<float>> log_probs_;
  std::vector<std::exception_ptr> failures_;
  std::vector<std::thread> threads_;
};

}  // namespace

std::vector<std::vector<float>> run_in_turn_rounds(int64_t count,
                                                   const std::function<void(int64_t, const agent::TurnSampler&)>& episode,
                                                   const TurnRoundGenerator& generate_round, TurnRoundStats* stats) {
  HF_CHECK(count >= 0, "run_in_turn_rounds: episode count ", count, " is negative");
  const auto n = static_cast<size_t>(count);
  TurnRoundStats counted;
  EpisodeBoard board(count, episode);

  // Rounds: when every running episode waits for a turn, generate all of their turns together.
  while (true) {
    std::vector<size_t> rows;
    std::vector<std::vector<int32_t>> contexts;
    std::vector<int64_t> limits;
    {
      std::unique_lock<std::mutex> lock(board.mutex);
      board.changed.wait(lock, [&] { return board.running == 0 || board.asked == board.running; });
      if (board.running == 0) break;
      for (size_t i = 0; i < n; ++i) {
        if (!board.requests[i]) continue;
        rows.push_back(i);
        counted.prefill_tokens += static_cast<int64_t>(board.requests[i]->context.size());
        contexts.push_back(std::move(board.requests[i]->context));
        limits.push_back(board.requests[i]->max_new_tokens);
        board.requests[i].reset();
      }
      board.asked = 0;
      board.ended.clear();
    }
    std::vector<SampledTurn> turns;
    std::exception_ptr failed;
    const double start = steady_seconds();
    try {
      turns = generate_round(contexts, limits, counted.rounds);
      HF_CHECK(turns.size() == rows.size(), "run_in_turn_rounds: round ", counted.rounds, " generated ",
               turns.size(), " turns for ", rows.size(), " requests");
    } catch (...) {
      failed = std::current_exception();
    }
    counted.generation_seconds += steady_seconds() - start;
    ++counted.rounds;
    counted.turns += static_cast<int64_t>(rows.size());
    counted.largest_round = std::max<int64_t>(counted.largest_round, static_cast<int64_t>(rows.size()));
    std::lock_guard<std::mutex> lock(board.mutex);
    for (size_t k = 0; k < rows.size(); ++k) {
      if (failed)
        board.turn_failures[rows[k]] = failed;
      else
        board.replies[rows[k]] = std::move(turns[k]);
      board.wake(rows[k]);
    }
  }
  std::vector<std::vector<float>> log_probs = board.finish();
  if (stats != nullptr) *stats = counted;
  return log_probs;
}

EpisodeRunner turn_rounds_runner(TurnRoundGenerator generate_round) {
  return [generate_round = std::move(generate_round)](int64_t count, const EpisodeFunction& episode,
                                                      TurnRoundStats* stats) {
    return run_in_turn_rounds(count, episode, generate_round, stats);
  };
}

namespace {

TurnRoundStats continuous_turn_stats(const TurnBatcher& batcher, double generation_seconds) {
  const TurnBatcherStats b = batcher.stats();
  TurnRoundStats s;
  s.turns = b.turns;
  s.largest_round = b.largest_step;
  s.prefill_tokens = b.prefill_tokens;
  s.reused_tokens = b.reused_tokens;
  s.decode_steps = b.decode_steps;
  s.host_syncs = b.host_syncs;
  s.peak_kv_blocks = b.peak_blocks;
  s.shared_prompt_tokens = b.shared_prompt_tokens;
  s.shared_prompt_blocks = b.shared_prompt_blocks;
  s.prefix_cached_tokens = b.prefix_cached_tokens;
  s.prefill_forwards = b.prefill_forwards;
  s.generation_seconds = generation_seconds;
  return s;
}

// The group whose rank 0 runs the episodes and whose other ranks follow its schedule: the tensor-parallel
// ranks, or the pipeline stages; nullptr when the model is whole in this process.
Communicator* turn_schedule_group(CausalLM& model, Communicator* stages) {
  const PipelineStage& stage = model->pipeline_stage();
  const TensorParallelGroup& tensor_parallel = model->tensor_parallel();
  HF_CHECK(!stage.enabled() || !tensor_parallel.enabled(), "agent rollout: multi-turn rollouts run over pipeline ",
           "stages or tensor-parallel ranks, not both (actor_rollout_ref.rollout.pipeline_model_parallel_size = ",
           stage.stages, ", actor_rollout_ref.rollout.tensor_model_parallel_size = ", tensor_parallel.size(), ")");
  if (stage.enabled()) {
    HF_CHECK(stages != nullptr && stages->size() == stage.stages && stages->rank() == stage.stage,
             "agent rollout: the model is pipeline stage ", stage.stage, " of ", stage.stages,
             " and needs the communicator over its stages (one rank per stage, in stage order)");
    return stages;
  }
  return tensor_parallel.enabled() ? tensor_parallel.comm() : nullptr;
}

}  // namespace

std::vector<std::vector<float>> run_in_continuous_turns(int64_t count, const EpisodeFunction& episode, CausalLM& model,
                                                        const GenerationConfig& config, TurnRoundStats* stats,
                                                        int64_t group_size, Communicator* stages,
                                                        std::chrono::milliseconds keep_alive) {
  HF_CHECK(count >= 0, "run_in_continuous_turns: episode count ", count, " is negative");
  HF_CHECK(keep_alive.count() > 0, "run_in_continuous_turns: the keep-alive interval must be > 0 ms");
  const auto n = static_cast<size_t>(count);
  // Tensor parallelism or stages: rank 0 runs the episodes and their tools; the other ranks repeat its schedule.
  Communicator* schedule_group = turn_schedule_group(model, stages);
  TurnBatcher batcher(model, config, count, group_size, model->pipeline_stage().enabled() ? stages : nullptr);
  const torch::Device device = model->parameters().front().device();
  if (schedule_group != nullptr && schedule_group->rank() != 0) {
    const double start = steady_seconds();
    const int64_t keep_alives = follow_turn_schedule(batcher, *schedule_group, device);
    if (stats != nullptr) {
      *stats = continuous_turn_stats(batcher, steady_seconds() - start);
      stats->keep_alive_steps = keep_alives;
    }
    return {};
  }
  int64_t keep_alives = 0;
  EpisodeBoard board(count, episode);

  // The batcher's thread: takes new turns and ended episodes, then runs one step while any turn is under way.
  std::exception_ptr failed;  // generation failed: every turn under way and every later one fails with it
  std::vector<bool> in_flight(n, false);
  double generation_seconds = 0;
  bool over = false;
  while (true) {
    std::vector<std::pair<size_t, EpisodeBoard::Request>> fresh;
    std::vector<int64_t> ended;
    {
      std::unique_lock<std::mutex> lock(board.mutex);
      // A turn waiting for blocks waits for an episode to end; one just submitted starts in the step below.
      const bool busy = !failed && batcher.running_turns() > 0;
      auto news = [&] { return board.asked > 0 || !board.ended.empty() || board.running == 0; };
      if (!busy && schedule_group == nullptr) board.changed.wait(lock, news);
      if (!busy && schedule_group != nullptr) board.changed.wait_for(lock, keep_alive, news);
      for (size_t i = 0; i < n && board.asked > 0; ++i)
        if (board.requests[i]) {
          fresh.emplace_back(i, std::move(*board.requests[i]));
          board.requests[i].reset();
          --board.asked;
        }
      ended.swap(board.ended);
      over = board.running == 0 && fresh.empty() && (failed || batcher.idle());
    }
    TurnScheduleStep schedule;
    if (over) {
      schedule.done = true;
      if (schedule_group != nullptr) share_turn_schedule(schedule, *schedule_group, device);
      break;
    }
    for (int64_t e : ended) batcher.release(e);
    schedule.released = std::move(ended);
    std::vector<std::pair<size_t, std::exception_ptr>> refused;
    for (auto& [i, request] : fresh) {
      if (failed) {
        refused.emplace_back(i, failed);
        continue;
      }
      std::vector<int64_t> context(request.context.begin(), request.context.end());
      try {
        batcher.submit(static_cast<int64_t>(i), context, request.max_new_tokens);
        in_flight[i] = true;
        if (schedule_group != nullptr)
          schedule.submitted.push_back({static_cast<int64_t>(i), request.max_new_tokens, std::move(context)});
      } catch (...) {
        refused.emplace_back(i, std::current_exception());
      }
    }
    schedule.step = !failed && !batcher.idle();
    if (schedule_group != nullptr) {
      if (schedule.empty()) ++keep_alives;
      share_turn_schedule(schedule, *schedule_group, device);
    }
    std::vector<BatchedTurn> turns;
    if (schedule.step) {
      const double start = steady_seconds();
      try {
        turns = batcher.step();
      } catch (...) {
        failed = std::current_exception();
        for (size_t i = 0; i < n; ++i)
          if (in_flight[i]) refused.emplace_back(i, failed);
      }
      generation_seconds += steady_seconds() - start;
    }
    std::lock_guard<std::mutex> lock(board.mutex);
    for (auto& [i, error] : refused) {
      board.turn_failures[i] = error;
      in_flight[i] = false;
      board.wake(i);
    }
    for (BatchedTurn& turn : turns) {
      const auto i = static_cast<size_t>(turn.conversation);
      in_flight[i] = false;
      SampledTurn reply;
      reply.ids.assign(turn.ids.begin(), turn.ids.end());
      reply.log_probs = std::move(turn.log_probs);
      board.replies[i] = std::move(reply);
      board.wake(i);
    }
  }
  std::vector<std::vector<float>> log_probs = board.finish();
  if (stats != nullptr) {
    *stats = continuous_turn_stats(batcher, generation_seconds);
    stats->keep_alive_steps = keep_alives;
  }
  return log_probs;
}

EpisodeRunner continuous_turns_runner(CausalLM& model, const GenerationConfig& config, int64_t group_size,
                                      Communicator* stages) {
  return [&model, config, group_size, stages](int64_t count, const EpisodeFunction& episode, TurnRoundStats* stats) {
    return run_in_continuous_turns(count, episode, model, config, stats, group_size, stages);
  };
}

bool continuous_turns_apply(CausalLM&, const GenerationConfig& config) {
  return config.use_kv_cache && config.continuous_batching && config.paged_kv_cache && !config.refresh_weights &&
         !config.record_routing;
}

TurnRoundGenerator engine_turn_rounds(CausalLM& model, const GenerationConfig& config) {
  return [&model, config](const std::vector<std::vector<int32_t>>& contexts, const std::vector<int64_t>& limits,
                          int64_t round) {
    GenerationConfig g = config;
    g.n = 1;
    g.max_new_tokens = 1;
    for (int64_t limit : limits) {
      HF_CHECK(limit >= 1, "agent rollout: a turn may have ", limit, " new tokens; at least 1 is needed");
      g.max_new_tokens = std::max(g.max_new_tokens, limit);
    }
    // Each round draws afresh: row q of round r uses the uniforms of (seed(r), q, t).
    g.seed = config.seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(round) * 0xBF58476D1CE4E5B9ULL + 1;
    std::vector<std::vector<int64_t>> prompts;
    prompts.reserve(contexts.size());
    for (const auto& c : contexts) prompts.emplace_back(c.begin(), c.end());
    const GenerationOutput out = generate(model, prompts, g, nullptr);
    const auto responses = out.responses.to(torch::kCPU, torch::kLong).contiguous();
    const auto mask = out.response_mask.to(torch::kCPU, torch::kLong).contiguous();
    const auto lp = out.log_probs.to(torch::kCPU, torch::kFloat).contiguous();
    std::vector<SampledTurn> turns(contexts.size());
    for (size_t q = 0; q < contexts.size(); ++q) {
      const auto row = static_cast<int64_t>(q);
      // A shorter request than the round's longest: its draws are the first ones of the longer row (token t
      // of a row depends on (seed, q, t) and the tokens before it only).
      const int64_t length = std::min(mask[row].sum().item<int64_t>(), limits[q]);
      for (int64_t t = 0; t < length; ++t) {
        turns[q].ids.push_back(static_cast<int32_t>(responses[row][t].item<int64_t>()));
        turns[q].log_probs.push_back(lp[row][t].item<float>());
      }
    }
    return turns;
  };
}

DataProto agent_rollout_batch(const std::vector<agent::Trajectory>& trajectories,
                              const std::vector<std::vector<float>>& log_probs, int64_t response_length,
                              int64_t pad_id) {
  HF_CHECK(trajectories.size() == log_probs.size(), "agent_rollout_batch: ", trajectories.size(),
           " trajectories but log-probs for ", log_probs.size());
  const auto rows = static_cast<int64_t>(trajectories.size());
  int64_t prompt_length = 0;
  for (const auto& t : trajectories) prompt_length = std::max<int64_t>(prompt_length, static_cast<int64_t>(t.prompt_ids.size()));
  auto prompts = torch::full({rows, prompt_length}, pad_id, torch::kLong);
  auto prompt_mask = torch::zeros({rows, prompt_length}, torch::kLong);
  auto responses = torch::full({rows, response_length}, pad_id, torch::kLong);
  auto response_mask = torch::zeros({rows, response_length}, torch::kLong);
  auto response_attention = torch::zeros({rows, response_length}, torch::kLong);
  auto rollout_log_probs = torch::zeros({rows, response_length}, torch::kFloat);
  auto p = prompts.accessor<int64_t, 2>();
  auto pm = prompt_mask.accessor<int64_t, 2>();
  auto r = responses.accessor<int64_t, 2>();
  auto rm = response_mask.accessor<int64_t, 2>();
  auto ra = response_attention.accessor<int64_t, 2>();
  auto lp = rollout_log_probs.accessor<float, 2>();
  for (int64_t i = 0; i < rows; ++i) {
    const agent::Trajectory& t = trajectories[static_cast<size_t>(i)];
    const std::vector<float>& sampled = log_probs[static_cast<size_t>(i)];
    HF_CHECK(t.response_mask.size() == t.response_ids.size(), "agent_rollout_batch: trajectory ", i, " has ",
             t.response_ids.size(), " response ids but a mask of ", t.response_mask.size());
    HF_CHECK(static_cast<int64_t>(t.response_ids.size()) <= response_length, "agent_rollout_batch: trajectory ", i,
             " has ", t.response_ids.size(), " response ids, more than response_length ", response_length);
    const auto offset = prompt_length - static_cast<int64_t>(t.prompt_ids.size());
    for (size_t k = 0; k < t.prompt_ids.size(); ++k) {
      p[i][offset + static_cast<int64_t>(k)] = t.prompt_ids[k];
      pm[i][offset + static_cast<int64_t>(k)] = 1;
    }
    size_t next_sampled = 0;
    for (size_t k = 0; k < t.response_ids.size(); ++k) {
      const auto at = static_cast<int64_t>(k);
      r[i][at] = t.response_ids[k];
      ra[i][at] = 1;
      if (t.response_mask[k] == 0) continue;
      HF_CHECK(next_sampled < sampled.size(), "agent_rollout_batch: trajectory ", i, " has more sampled ids than its ",
               sampled.size(), " log-probs");
      rm[i][at] = 1;
      lp[i][at] = sampled[next_sampled++];
    }
    HF_CHECK(next_sampled == sampled.size(), "agent_rollout_batch: trajectory ", i, " has ", next_sampled,
             " sampled ids but ", sampled.size(), " log-probs");
  }
  DataProto b;
  b.set_tensor("prompts", prompts);
  b.set_tensor("responses", responses);
  b.set_tensor("response_mask", response_mask);
  b.set_tensor("input_ids", torch::cat({prompts, responses}, 1));
  b.set_tensor("attention_mask", torch::cat({prompt_mask, response_attention}, 1));
  b.set_tensor("rollout_log_probs", rollout_log_probs);
  return b;
}

AgentRollout run_agent_rollout(const std::vector<AgentRolloutRow>& rows, const text::Tokenizer& tokenizer,
                               const text::TokenizerConfig& tokenizer_config,
                               const agent::AgentEnvironment& environment, const agent::EpisodeSetup& setup,
                               const TurnRoundGenerator& generate_round) {
  return run_agent_rollout(rows, tokenizer, tokenizer_config, environment, setup, turn_rounds_runner(generate_round));
}

AgentRollout run_agent_rollout(const std::vector<AgentRolloutRow>& rows, const text::Tokenizer& tokenizer,
                               const text::TokenizerConfig& tokenizer_config,
                               const agent::AgentEnvironment& environment, const agent::EpisodeSetup& setup,
                               const EpisodeRunner& runner) {
  const agent::Json tool_schemas = environment.tools.schemas();
  // Each row's setup first, so that a bad row fails before any episode starts.
  std::vector<agent::EpisodeSetup> setups;
  std::vector<bool> with_tools;
  for (size_t i = 0; i < rows.size(); ++i) {
    const AgentRolloutRow& row = rows[i];
    agent::EpisodeSetup s = setup;
    const bool single_turn = row.agent_name.empty() || row.agent_name == "single_turn_agent";
    s.tools = single_turn ? nullptr : &environment.tools;
    s.interaction = nullptr;
    s.tools_kwargs = row.tools_kwargs;
    s.interaction_kwargs = row.interaction_kwargs;
    if (single_turn) s.limits.max_assistant_turns = 1;
    if (!single_turn && row.interaction_kwargs.is_object() && row.interaction_kwargs.contains("name")) {
      const std::string name = row.interaction_kwargs.at("name").get<std::string>();
      const auto it = environment.interactions.find(name);
      HF_CHECK(it != environment.interactions.end(), "agent rollout: row ", i, "'s interaction_kwargs.name '", name,
               "' is not in the interaction config (", environment.interactions.size(), " interactions)");
      s.interaction = it->second.get();
    }
    setups.push_back(std::move(s));
    with_tools.push_back(!single_turn);
  }
  AgentRollout out;
  out.episodes.resize(rows.size());
  out.log_probs = runner(
      static_cast<int64_t>(rows.size()),
      [&](int64_t i, const agent::TurnSampler& sample) {
        const auto at = static_cast<size_t>(i);
        agent::TrajectoryBuilder builder(tokenizer, tokenizer_config, with_tools[at] ? tool_schemas : agent::Json(),
                                         setups[at].template_variables);
        out.episodes[at] = agent::run_episode(builder, tokenizer, rows[at].messages, sample, setups[at]);
      },
      &out.rounds);
  return out;
}

nlohmann::json agent_episode_record(const agent::Episode& episode) {
  const agent::EpisodeStats& st = episode.stats;
  nlohmann::json tools = nlohmann::json::object();
  for (const auto& [tool, counts] : st.per_tool) {
    nlohmann::json errors = nlohmann::json::object();
    for (const auto& [status, n] : counts.errors) errors[status] = n;
    tools[tool] = {{"calls", counts.calls}, {"seconds", counts.seconds}, {"errors", errors}};
  }
  return {{"turns", st.assistant_turns},
          {"user_turns", st.user_turns},
          {"tool_calls", st.tool_calls},
          {"tool_errors", st.tool_errors},
          {"malformed_calls", st.malformed_calls},
          {"sampled_tokens", st.sampled_tokens},
          {"appended_tokens", st.appended_tokens},
          {"stop", agent::episode_stop_name(st.stop)},
          {"tools", tools},
          {"interaction_rewards", st.interaction_rewards},
          {"interaction_error", st.interaction_error},
          {"messages", nlohmann::json::parse(episode.trajectory.messages.dump())}};
}

nlohmann::json agent_episode_metrics(const std::vector<nlohmann::json>& records) {
  nlohmann::json m = nlohmann::json::object();
  if (records.empty()) return m;
  const auto episodes = static_cast<double>(records.size());
  double turns = 0, user_turns = 0, calls = 0, errors = 0, malformed = 0, seconds = 0, sampled = 0, appended = 0;
  std::map<std::string, double> stops, calls_by_tool, errors_by_tool, seconds_by_tool, by_status;
  for (const auto& r : records) {
    turns += r.at("turns").get<double>();
    user_turns += r.at("user_turns").get<double>();
    calls += r.at("tool_calls").get<double>();
    errors += r.at("tool_errors").get<double>();
    malformed += r.at("malformed_calls").get<double>();
    sampled += r.at("sampled_tokens").get<double>();
    appended += r.at("appended_tokens").get<double>();
    stops[r.at("stop").get<std::string>()] += 1;
    for (const auto& [tool, counts] : r.at("tools").items()) {
      calls_by_tool[tool] += counts.at("calls").get<double>();
      seconds_by_tool[tool] += counts.at("seconds").get<double>();
      seconds += counts.at("seconds").get<double>();
      for (const auto& [status, n] : counts.at("errors").items()) {
        errors_by_tool[tool] += n.get<double>();
        by_status[status] += n.get<double>();
      }
    }
  }
  m["agent/turns_per_episode"] = turns / episodes;
  m["agent/user_turns_per_episode"] = user_turns / episodes;
  m["agent/tool_calls"] = calls;
  m["agent/tool_calls_per_episode"] = calls / episodes;
  m["agent/tool_errors"] = errors;
  m["agent/tool_timeouts"] = by_status["timed_out"];
  m["agent/malformed_calls"] = malformed;
  m["agent/tool_seconds"] = seconds;
  m["agent/sampled_tokens_per_episode"] = sampled / episodes;
  m["agent/appended_tokens_per_episode"] = appended / episodes;
  for (const auto& [tool, n] : calls_by_tool) m["agent/tool_calls/" + tool] = n;
  for (const auto& [tool, n] : errors_by_tool) m["agent/tool_errors/" + tool] = n;
  for (const auto& [tool, s] : seconds_by_tool) m["agent/tool_seconds/" + tool] = s;
  for (const auto& [status, n] : by_status) m["agent/tool_status/" + status] = n;
  double truncated = 0;
  for (const auto& [stop, n] : stops) {
    m["agent/stop/" + stop] = n;
    if (stop == "response_length" || stop == "max_assistant_turns" || stop == "max_user_turns") truncated += n;
  }
  m["agent/truncated_episodes"] = truncated;
  m["agent/truncated_by_turns"] = stops["max_assistant_turns"] + stops["max_user_turns"];
  m["agent/truncated_by_length"] = stops["response_length"];
  return m;
}

nlohmann::json agent_rollout_metrics(const AgentRollout& rollout) {
  std::vector<nlohmann::json> records;
  records.reserve(rollout.episodes.size());
  for (const auto& e : rollout.episodes) records.push_back(agent_episode_record(e));
  nlohmann::json m = agent_episode_metrics(records);
  if (rollout.episodes.empty()) return m;
  const TurnRoundStats& r = rollout.rounds;
  m["agent/prefill_tokens"] = r.prefill_tokens;
  m["agent/generation_seconds"] = r.generation_seconds;
  if (r.rounds > 0) {
    m["agent/rounds"] = r.rounds;
    m["agent/largest_round"] = r.largest_round;
  } else {
    m["agent/decode_steps"] = r.decode_steps;
    m["agent/largest_step"] = r.largest_round;
    m["agent/reused_prefix_tokens"] = r.reused_tokens;
    m["agent/peak_kv_blocks"] = r.peak_kv_blocks;
    m["agent/shared_prompt_blocks"] = r.shared_prompt_blocks;
    m["agent/shared_prompt_tokens"] = r.shared_prompt_tokens;
    m["agent/prefix_cached_tokens"] = r.prefix_cached_tokens;
    m["agent/prefill_forwards"] = r.prefill_forwards;
  }
  return m;
}

std::vector<AgentRolloutRow> agent_rollout_rows(const DataProto& prompts) {
  const bool has_messages = prompts.has_field("messages");
  HF_CHECK(has_messages || prompts.has_field("prompt"),
           "agent rollout: the prompt batch has neither a 'messages' nor a 'prompt' field");
  const auto& source = prompts.field(has_messages ? "messages" : "prompt");
  auto optional_field = [&](const char* key, size_t i) {
    return prompts.has_field(key) ? agent::Json::parse(prompts.field(key)[i].dump()) : agent::Json();
  };
  std::vector<AgentRolloutRow> rows(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    AgentRolloutRow& row = rows[i];
    const nlohmann::json& m = source[i];
    if (m.is_string())
      row.messages = agent::Json::array({{{"role", "user"}, {"content", m.get<std::string>()}}});
    else {
      HF_CHECK(m.is_array() && !m.empty(), "agent rollout: row ", i, "'s ", has_messages ? "messages" : "prompt",
               " is neither a string nor a non-empty list of messages: ", m.dump().substr(0, 200));
      row.messages = agent::Json::parse(m.dump());
    }
    const agent::Json name = optional_field("agent_name", i);
    if (!name.is_null()) {
      HF_CHECK(name.is_string(), "agent rollout: row ", i, "'s agent_name is not a string: ", name.dump());
      row.agent_name = name.get<std::string>();
    }
    for (auto [key, target] : {std::pair{"tools_kwargs", &row.tools_kwargs},
                               std::pair{"interaction_kwargs", &row.interaction_kwargs}}) {
      agent::Json value = optional_field(key, i);
      if (value.is_null()) continue;
      HF_CHECK(value.is_object(), "agent rollout: row ", i, "'s ", key, " is not an object: ", value.dump().substr(0, 200));
      *target = std::move(value);
    }
  }
  return rows;
}

DataProto agent_generate_sequences(CausalLM& model, const GenerationConfig& g, const DataProto& prompts,
                                   const AgentRolloutContext& context, Communicator* stages) {
  HF_CHECK(context.tokenizer && context.tokenizer_config && context.environment,
           "agent rollout: the worker has no tokenizer, chat template or agent environment");
  const std::vector<AgentRolloutRow> rows = agent_rollout_rows(prompts);
  std::vector<AgentRolloutRow> samples;
  for (const auto& row : rows)
    for (int64_t j = 0; j < g.n; ++j) samples.push_back(row);
  agent::EpisodeSetup setup = context.setup;
  setup.limits.max_response_tokens = g.max_new_tokens;
  // Continuous batching of turns where it applies, a group's g.n episodes sharing their prompt's blocks;
  // rounds otherwise (the static or slot-cache generator, partial rollouts, routing records).
  const bool continuous = context.continuous_turns && continuous_turns_apply(model, g);
  const int64_t group_size = context.share_prompt_blocks ? g.n : 1;
  // Under tensor parallelism or stages only rank 0 runs episodes (each tool call once); rounds would run them on
  // every rank.
  Communicator* schedule_group = turn_schedule_group(model, stages);
  HF_CHECK(schedule_group == nullptr || continuous, "agent rollout: multi-turn rollouts under ",
           model->pipeline_stage().enabled() ? "actor_rollout_ref.rollout.pipeline_model_parallel_size = "
                                             : "actor_rollout_ref.rollout.tensor_model_parallel_size = ",
           schedule_group == nullptr ? 1 : schedule_group->size(), " run their turns by continuous batching: they need "
           "actor_rollout_ref.rollout.kv_cache = paged, no partial rollouts and no routing record (router_replay R3)");
  if (schedule_group != nullptr && schedule_group->rank() != 0) {
    // The other ranks repeat rank 0's schedule; the rollout's batch is rank 0's (the collect takes it alone).
    run_in_continuous_turns(static_cast<int64_t>(samples.size()), EpisodeFunction(), model, g, nullptr, group_size,
                            stages);
    return DataProto();
  }
  const EpisodeRunner runner = continuous ? continuous_turns_runner(model, g, group_size, stages)
                                          : turn_rounds_runner(engine_turn_rounds(model, g));
  const AgentRollout rollout = run_agent_rollout(samples, *context.tokenizer, *context.tokenizer_config,
                                                 *context.environment, setup, runner);
  std::vector<agent::Trajectory> trajectories;
  trajectories.reserve(rollout.episodes.size());
  for (const auto& e : rollout.episodes) trajectories.push_back(e.trajectory);
  DataProto result = agent_rollout_batch(trajectories, rollout.log_probs, g.max_new_tokens, g.pad_token_id)
                         .to(model->parameters().front().device());
  if (!prompts.fields().empty()) {
    DataProto fields;
    for (const auto& [key, values] : prompts.fields()) fields.set_field(key, values);
    result.update(fields.repeat(g.n, /*interleave=*/true));
  }
  // Each sample's episode (its stats and whole conversation) rides with it, so that the trainer's metrics and
  // samples cover every replica's episodes.
  std::vector<nlohmann::json> records;
  records.reserve(rollout.episodes.size());
  for (const auto& e : rollout.episodes) records.push_back(agent_episode_record(e));
  result.set_field("agent_episode", std::move(records));
  result.meta()["agent"] = agent_rollout_metrics(rollout);
  return result;
}

namespace {

agent::MultiTurnToolConfig agent_tool_config(const nlohmann::json& spec) {
  agent::MultiTurnToolConfig c;
  c.tool_config_path = spec.value("tool_config_path", std::string());
  c.interaction_config_path = spec.value("interaction_config_path", std::string());
  c.options.max_parallel_calls = spec.value("max_parallel_calls", c.options.max_parallel_calls);
  c.options.max_tool_response_length = spec.value("max_tool_response_length", c.options.max_tool_response_length);
  if (spec.contains("tool_response_truncate_side"))
    c.options.truncate_side = agent::truncate_side_from_name(spec.at("tool_response_truncate_side").get<std::string>(),
                                                             "rollout.multi_turn.tool_response_truncate_side");
  return c;
}

std::string agent_tokenizer_dir(const nlohmann::json& spec) {
  HF_CHECK(spec.contains("tokenizer_dir") && spec.at("tokenizer_dir").is_string(),
           "rollout.multi_turn: 'tokenizer_dir' (the directory of tokenizer.json and the chat template) is required");
  return spec.at("tokenizer_dir").get<std::string>();
}

}  // namespace

AgentRolloutRuntime::AgentRolloutRuntime(const nlohmann::json& multi_turn)
    : tokenizer_(text::Tokenizer::from_file(agent_tokenizer_dir(multi_turn) + "/tokenizer.json")),
      tokenizer_config_(text::TokenizerConfig::load(agent_tokenizer_dir(multi_turn) + "/tokenizer_config.json")),
      environment_(agent::load_agent_environment(agent_tool_config(multi_turn))) {
  context_.tokenizer = &tokenizer_;
  context_.tokenizer_config = &tokenizer_config_;
  context_.environment = &environment_;
  context_.setup.format = text::tool_call_format_from_name(multi_turn.value("format", std::string("hermes")));
  context_.setup.tool_options = environment_.options;
  context_.setup.limits.max_assistant_turns = multi_turn.value("max_assistant_turns", 5);
  context_.setup.limits.max_user_turns = multi_turn.value("max_user_turns", 5);
  // The prompt encoder's template settings (trainer: data.apply_chat_template_kwargs, model.custom_chat_template),
  // so that a conversation's first prompt renders as a single-turn prompt does.
  if (multi_turn.contains("chat_template_kwargs"))
    context_.setup.template_variables = multi_turn.at("chat_template_kwargs");
  if (multi_turn.contains("chat_template"))
    tokenizer_config_.replace_chat_template(multi_turn.at("chat_template").get<std::string>());
}

}  // namespace hybridflow
