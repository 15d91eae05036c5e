// Internal to trainer/: the state behind RLTrainer, shared by the files that implement it
// (rl_trainer.cpp: the step and the loop; rl_trainer_setup.cpp: data, groups and processes;
// rl_trainer_scoring.cpp: prompts, rule rewards and costs; rl_trainer_checkpoint.cpp: save and resume).
#pragma once

#include "hybridflow/trainer/rl_trainer.h"

#include "role_spec_builders.h"
#include "run_spec_builders.h"
#include "stream_pending.h"

#include <algorithm>
#include <deque>
#include <iostream>
#include <optional>

#include "hybridflow/algo/advantage.h"
#include "hybridflow/algo/algo_config.h"
#include "hybridflow/algo/kl.h"
#include "hybridflow/algo/masked.h"
#include "hybridflow/algo/safe_rlhf.h"
#include "hybridflow/core/dir_lock.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/logging.h"
#include "hybridflow/model/model_config.h"
#include "hybridflow/engine/weight_sync.h"
#include "hybridflow/model/tokenizer.h"
#include "hybridflow/placement/placement_spec.h"
#include "hybridflow/runtime/call_profiler.h"
#include "hybridflow/runtime/call_timeline.h"
#include "hybridflow/runtime/controller.h"
#include "hybridflow/tasks/dataset.h"
#include "hybridflow/tasks/task.h"
#include "hybridflow/trainer/checkpoint.h"
#include "hybridflow/trainer/metrics_log.h"
#include "hybridflow/engine/prompt_encoder.h"
#include "hybridflow/workers/checkpoint_io.h"
#include "hybridflow/workers/reward_function.h"
#include "hybridflow/workers/rl_batch.h"
#include "hybridflow/workers/rl_workers.h"

namespace hybridflow {

class StoreServer;

// 0..size-1 in an order that is a function of `seed` alone, the same with every standard library (the data
// order of each epoch, data.train_max_samples' subset).
std::vector<int64_t> seeded_permutation(int64_t size, uint64_t seed);

struct RLTrainer::State {
  // The constructor's steps, in order (rl_trainer_setup.cpp). open_run returns the checkpoint to resume
  // from ("" for a fresh start), resolved before any worker starts.
  std::string open_run();  // with dry_run: no run directory, lock or metrics sinks
  void load_data();
  void make_scorers();
  void choose_roles();
  void place_roles();
  void specify_roles();
  // open_run to specify_roles: every check before a process starts (RLTrainer::check stops here); returns
  // open_run's checkpoint.
  std::string prepare();
  void create_groups();
  void start(const std::string& resume_dir);

  // Held for the whole run (and released last): a second run on the same run_dir fails at start.
  std::unique_ptr<DirectoryLock> run_dir_lock;
  Config cfg;
  bool dry_run = false;  // RLTrainer::check: every check, nothing written, no worker
  // The run's settings besides the roles' (trainer/run_spec.h), built first: every trainer, data, algorithm
  // and scoring key is read there; the rest of the trainer reads the fields. `cfg` stays for the role
  // specs' builders, the data loading, the placement and a program's own keys (RLStep::config()).
  RunSpec run;
  std::unique_ptr<Task> task;
  Tokenizer tokenizer;
  std::vector<EncodedPrompt> train, test;  // encoded and held to data.max_prompt_length at load
  PromptOptions prompt_options;            // how they were encoded; a multi-turn rollout renders with it too
  std::string train_source, test_source;  // where they came from (a file, or the task), for errors
  int64_t data_pos = 0;
  int64_t step = 0;
  bool use_critic = false;
  bool need_ref = false;
  bool use_reward_model = false;  // reward_model.enable
  // The model every role starts from, and each role's spec and layout.
  ModelSpec model;
  // Its architecture (workers/model_spec.h), as the workers build it: the context check, balance_batch's row
  // weights and `train --check` read it.
  ModelConfig model_config;
  RoleSpecs specs;
  std::unique_ptr<RewardFunction> reward_fn;  // null: the task's own score()
  // Safe-RLHF, on when a cost is configured (cost_model.enable or cost.type): the multiplier, and the
  // external cost scorer of cost.type command/http (null for contains/none).
  std::optional<algo::LagrangeMultiplier> lagrange;
  std::unique_ptr<RewardFunction> cost_fn;
  algo::KlController kl_ctrl = algo::KlController::fixed(0.0);
  std::unique_ptr<MetricsLog> metrics;
  // Every worker-group call of the run, drained each step into <run_dir>/timeline.jsonl.
  std::shared_ptr<CallTimeline> timeline = std::make_shared<CallTimeline>();
  MetricsSinks sinks;        // trainer.logger
  bool console_log = true;   // trainer.logger has console: the progress line
  RolePlacement placement;   // which pool each role runs in (placement/placement_spec.h)
  // The c10d store of the group spanning the actor's and a standalone rollout's processes (weight sync);
  // declared before the controller so that it outlives every worker that joined it.
  std::shared_ptr<StoreServer> weight_sync_store;
  // Declared before the groups so that the groups go first on destruction.
  Controller controller;
  std::unique_ptr<WorkerGroup> actor, critic, reward_model;
  std::unique_ptr<WorkerGroup> cost_model, cost_critic;  // Safe-RLHF
  std::unique_ptr<WorkerGroup> rollout;  // standalone generation (placement standalone); null: the actor generates
  // rollout.staleness k: the rollouts of the next steps (up to k), dispatched while this step trains, in
  // step order: the bounded buffer of a streaming rollout (rl_stages.cpp's sampled_generation fills it,
  // rl_trainer_placement.cpp checkpoints it). Each is a whole batch of whole groups.
  struct Prefetch {
    int64_t for_step = -1;  // the 0-based step it is for
    DataProto prompts;
    DataProto request;  // the generate_sequences request (sent again if the rollout pool dies before answering)
    Future batch;
  };
  std::deque<Prefetch> prefetch;
  // rollout.stream_groups on a standalone pool running ahead (staleness > 0): a step's request says so, its
  // prompts are published in the weight-sync store for the call queued before it, and every request carries
  // the prompts sent and not yet returned (stream_pending.h), which a reply may return in any step's batch.
  bool streams_groups() const {
    return specs.rollout.stream_groups && rollout && weight_sync_store && placement.staleness > 0;
  }
  StreamPending stream_pending;
  // A generate_sequences request as it is sent now: a streaming one with the pending list as it stands.
  DataProto as_sent(const DataProto& request) const {
    return request.meta().contains("stream_step") ? stream_pending.with_list(request) : request;
  }
  // The policy version the standalone rollout pool holds (the updates behind its weights), as last sent.
  int64_t rollout_version = 0;
  // The actor's own version: the updates it has applied (what a restarted rollout pool is sent).
  int64_t actor_version = 0;
  int64_t rollout_restarts = 0;  // of a dead standalone rollout pool (trainer.max_rollout_restarts)
  std::string resumed_from;      // "" for a fresh start
  std::string last_checkpoint;   // newest checkpoint written or resumed from
  int64_t last_saved_step = -1;
  bool kv_cache_logged = false;  // the rollout's KV-cache pool, said once per run

  // Prompts from[*pos ...], advancing *pos; with shuffle, each pass over `from` (epoch) in its own
  // seeded order (data.shuffle, verl's name), so a file sorted by difficulty is not trained in that order.
  DataProto next_prompts(int64_t count, const std::vector<EncodedPrompt>& from, int64_t* pos, bool shuffle) const;
  const std::vector<int64_t>& epoch_order(int64_t epoch, int64_t size) const;  // seeded_permutation of the epoch
  mutable int64_t order_epoch = -1;  // cache of epoch_order
  mutable std::vector<int64_t> order;
  // Mean rule score of the responses (val_kwargs: greedy by default) to the first `count` held-out prompts; the
  // validation of step `step` (0: before the first) for trainer.validation_data_dir and log_val_generations;
  // the per-source metrics into `metrics_out` when given.
  double evaluate(int64_t count, int64_t step, MetricsLog* metrics_out = nullptr);
  void add_validation_metrics(const DataProto& gen, const std::vector<double>& scores, int64_t n, MetricsLog& out) const;
  void log_validation(const DataProto& gen, const std::vector<double>& scores, int64_t step);
  std::vector<double> rule_scores(const DataProto& gen) const;
  std::vector<double> rule_costs(const DataProto& gen) const;
  // Each row's whole response (every id after the prompt, by the attention mask: a multi-turn response holds
  // tool and user turns that the response mask leaves out), special tokens skipped.
  std::vector<std::string> decode_responses(const DataProto& gen) const;
  // What the scorers judge: a multi-turn row's final assistant message (its content), else the response.
  std::vector<std::string> scored_responses(const DataProto& gen) const;
  // Whether the rollout runs agent episodes (actor_rollout_ref.rollout.multi_turn.enable).
  bool multi_turn() const { return specs.rollout.multi_turn.is_object(); }
  // What the command / HTTP scorers get for each decoded response of `gen`.
  std::vector<RewardRequest> reward_requests(const DataProto& gen, const std::vector<std::string>& texts) const;

  // Placement (rl_trainer_placement.cpp). The group that generates rollouts: the standalone rollout pool's,
  // else the actor's.
  WorkerGroup& generator() const { return rollout ? *rollout : *actor; }
  // Joins the actor's and the rollout's processes in one c10d group whose store this process hosts.
  void connect_weight_sync(const WeightSyncLayout& layout, int64_t bucket_megabytes, const std::string& dtype);
  // connect_weight_sync for the run's actor and rollout layouts.
  void connect_rollout_weight_sync();
  // The actor's weights to the rollout pool, as policy version `version` (the updates behind them):
  // dispatched (both sides' calls), then waited for, returning the figures to log.
  struct WeightSyncCalls {
    Future send, receive;
  };
  WeightSyncCalls dispatch_weight_sync(int64_t version);
  // A sync the rollout pool's death broke is replaced by the restart's (recover_rollout).
  nlohmann::json finish_weight_sync(const WeightSyncCalls& calls);
  // A dead standalone rollout pool (rollout_restarts.cpp). When its workers died (the pool failed):
  // restarts it up to trainer.max_rollout_restarts times (new processes, the rollout role, the weight sync
  // group, the actor's current weights), sends `lost` again (requests whose replies died with it, first)
  // and every buffered rollout that failed, and returns the restart's weight-sync figures; past the limit
  // an Error naming the key. Nullopt when the pool did not fail: the caller's error is another one.
  struct LostGeneration {
    Future* generation;
    const DataProto* request;
  };
  std::optional<nlohmann::json> recover_rollout(const std::vector<LostGeneration>& lost = {});
  // `generation` (a generate_sequences call on generator() with `request`) once it succeeded: with a
  // standalone rollout pool whose workers die meanwhile, made again on the restarted pool.
  Future surviving_rollout_deaths(Future generation, const DataProto& request);
  // The group of `role` on its pool, created with `config` (plus the model and thread count).
  std::unique_ptr<WorkerGroup> make_group(const std::string& role, const std::string& type,
                                          const ParallelLayout& layout, const ModelSpec& model, nlohmann::json config);
  void sync_rollout_weights() { finish_weight_sync(dispatch_weight_sync(step)); }
  // memory/<pool>/... for every pool and the controller (the largest figure over a pool's processes).
  void log_memory(MetricsLog& metrics);
  void log_pool_memory(MetricsLog& metrics);  // log_memory's figures, without restarting a dead rollout pool
  // The in-flight rollouts of a checkpoint (staleness k): written beside the workers' files, read on resume.
  void save_prefetch(const std::string& dir);
  void load_prefetch(const std::string& dir);
  // Sends the rollout pool the partial rollouts load_prefetch read, to go on where the checkpoint stopped
  // them (once the pool holds the resumed weights).
  void continue_saved_partial_rollouts();
  // Partial rollouts: asks the generations in flight to stop between two tokens while a checkpoint saves
  // (kRolloutPauseKey), and lets them go on; save_prefetch resumes them.
  void pause_partial_rollouts();
  void resume_partial_rollouts();
  bool rollouts_paused = false;

  // global_profiler (rl_trainer_profile.cpp): the groups to arm and their targets; arming for a step (1-based)
  // and disarming (at the end of the step `step` counts from 0), neither waited for; their calls' errors
  // surface at the next arming or at the run's end.
  std::vector<std::pair<WorkerGroup*, std::vector<CallProfileRequest::Target>>> profile_targets() const;
  void start_profile(int64_t global_step);
  void end_profile();
  void check_profile_calls();
  void finish_profiles();
  std::vector<Future> profile_calls;

  // Checkpoints (layout in trainer/checkpoint.h and workers/checkpoint_io.h).
  std::vector<WorkerGroup*> trainable_groups() const;
  // Everything step() reads that changes from one step to the next and lives on the controller.
  nlohmann::json controller_state() const;
  void restore_controller_state(const nlohmann::json& state, const std::string& file);
  std::string save_checkpoint();
  void resume(const std::string& dir);
  // At the end of a run with trainer.run_dir: the LoRA adapters of the actor and the critic (when they have
  // any) as PEFT directories <run_dir>/lora_adapter/<role>.
  void save_lora_adapters();
};


inline double mean_of(const torch::Tensor& t) { return t.numel() ? t.to(torch::kDouble).mean().item<double>() : 0.0; }

}  // namespace hybridflow
