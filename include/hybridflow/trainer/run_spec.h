// The run's settings besides the roles' (workers/role_specs.h), typed: the trainer's loop and checkpoints
// (trainer.*), the data order and batch sizes (data.*), the algorithm (algorithm.*) and how sequences are
// scored (reward.*, cost.*, reward_model.reward_clip and .overlong_buffer; the command / HTTP scorers'
// keys too, as workers/reward_function.h's RewardFunctionSpec). Built once when the trainer is
// built, with every check and default of these keys in one place (src/trainer/run_spec_builders.cpp); the
// step, the stages, the built-in programs and the checkpoint code read the fields, never the keys. A
// program of one's own reads its own extra keys through RLStep::config() (docs/new_algorithm.md).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hybridflow/core/cuda_memory_history.h"
#include "hybridflow/algo/advantage.h"
#include "hybridflow/algo/kl.h"
#include "hybridflow/algo/pf_ppo.h"
#include "hybridflow/algo/rollout_correction.h"
#include "hybridflow/algo/safe_rlhf.h"
#include "hybridflow/workers/reward_function.h"

namespace hybridflow {

// trainer.*: the loop, logging and checkpoints.
struct TrainerRunSpec {
  uint64_t seed = 0;         // trainer.seed: data order, sampling seeds and every role's init
  int64_t total_steps = 1;   // trainer.total_steps (> 0)
  std::string run_dir;       // trainer.run_dir ("" = no run directory)
  int64_t log_every = 1;     // trainer.log_every: the progress line every this many steps (>= 1)
  int64_t test_freq = 0;     // trainer.test_freq: held-out score every this many steps (0 = never)
  int64_t log_samples_freq = 0, log_samples_count = 0;  // trainer.log_samples_*
  // trainer.val_before_train: the held-out score before the first step; trainer.val_only: that score alone.
  bool val_before_train = true, val_only = false;
  int64_t log_val_generations = 0;  // trainer.log_val_generations: K held-out responses to the loggers per validation
  // trainer.rollout_data_dir / validation_data_dir: every generated row of a step (of a validation) as one line
  // of <dir>/<step>.jsonl, verl's format; "" = off.
  std::string rollout_data_dir, validation_data_dir;
  int64_t critic_warmup = 0;  // trainer.critic_warmup: the first N steps update the critics, not the actor
  bool balance_batch = true;  // trainer.balance_batch: like token counts on every data-parallel rank of an update
  // actor_rollout_ref.rollout.val_kwargs.*: how the held-out prompts are answered (verl's defaults: greedy, one).
  struct ValKwargs {
    bool do_sample = false;
    int64_t n = 1;
    double temperature = 0, top_p = 1.0;
    int64_t top_k = 0;  // 0 = off (verl's -1 too)
  } val_kwargs;
  bool save_checkpoint = false;  // trainer.save_checkpoint: a checkpoint at the end
  int64_t save_freq = 0;         // trainer.save_freq: a checkpoint every this many steps (0 = never)
  int64_t max_ckpt_to_keep = 0;  // trainer.max_ckpt_to_keep
  std::string resume_mode;       // trainer.resume_mode: disable | auto | resume_path (trainer/checkpoint.h)
  std::string resume_from_path;  // trainer.resume_from_path: set only with resume_mode resume_path
  int64_t max_rollout_restarts = 0;  // trainer.max_rollout_restarts: a dead standalone rollout pool restarted (>= 0)
  int threads_per_worker = 1;    // trainer.threads_per_worker
  std::vector<std::string> logger;  // trainer.logger (checked by the trainer as it makes the sinks)
  std::string device;               // trainer.device, as written (resolved with the placement)
  int64_t nnodes = 1;               // trainer.nnodes (null: 1)
  bool saves() const { return save_checkpoint || save_freq > 0; }
};

// data.*: what the step draws.
struct DataSpec {
  std::string task;  // data.task, with data.min_digits and data.max_digits (data.min_length, max_length)
  int min_digits = 1, max_digits = 1;
  int min_length = 3, max_length = 6;
  // data.train_file / data.test_file: one file or a list, read in order as one set (verl's data.train_files /
  // val_files); none = the task's generated examples.
  std::vector<std::string> train_files, test_files;
  int64_t train_size = 0;  // generated training examples (without data.train_file)
  int64_t train_max_samples = -1;     // data.train_max_samples: at most this many training prompts (-1 = all)
  // data.prompt_key / data.reward_fn_key: the data files' columns of the prompt and of its data source.
  std::string prompt_key = "prompt", reward_fn_key = "data_source";
  int64_t train_batch_size = 1;  // prompts per step
  int64_t gen_batch_size = 1;    // prompts per DAPO generation round (null: train_batch_size)
  int64_t test_size = 0;         // held-out prompts scored every trainer.test_freq steps
  bool shuffle = true;           // each epoch in its own seeded order
  // data.seed (verl's): the training prompts' order and train_max_samples' subset; null: trainer.seed. Which
  // prompts a task generates follows trainer.seed either way.
  std::optional<uint64_t> seed;
};

// algorithm.*: the estimator, the KL, the rollout correction, Safe-RLHF's multiplier and DAPO's filter.
struct AlgorithmSpec {
  std::string program;        // algorithm.program resolved (trainer/rl_program.h: rl_program_name)
  std::string adv_estimator;  // algorithm.adv_estimator, a registered estimator
  algo::AdvantageInput advantage;  // gamma, lam, norm_adv_by_std_in_grpo (tensors unset)
  bool use_kl_in_reward = false;
  algo::KlType reward_kl_type = algo::KlType::kK1;  // algorithm.kl_penalty
  struct KlCtrl {
    std::string type = "fixed";
    double kl_coef = 0.0, target_kl = 0.0, horizon = 0.0;
    algo::KlController controller() const { return algo::KlController::from_config(type, kl_coef, target_kl, horizon); }
  } kl_ctrl;
  algo::RolloutCorrectionConfig rollout_correction;
  bool bypass_mode = false;  // algorithm.rollout_correction.bypass_mode: the rollout's log-probs are the old policy's
  // algorithm.safe_rlhf.*: set when a cost is configured (cost_model.enable or cost.type other than none).
  std::optional<algo::LagrangeConfig> safe_rlhf;
  struct FilterGroups {
    bool enable = false;
    std::optional<std::string> metric;  // acc | score | seq_reward (all the sequence score)
    int64_t max_num_gen_batches = 0;    // 0 = no limit
  } filter_groups;
  // algorithm.use_pf_ppo (with gae): the updates train on a resample of the batch weighted by score (algo/pf_ppo.h).
  bool use_pf_ppo = false;
  algo::PfPpoConfig pf_ppo;
};

// How each sequence is scored: the rule reward and cost, the clip, DAPO's overlong penalty.
struct ScoringSpec {
  std::string reward_type;  // reward.type: task | none | command | http
  std::string cost_type;    // cost.type: none | contains | command | http
  std::vector<std::string> cost_contains;  // cost.contains (cost.type contains)
  // The scorers a section describes (workers/reward_function.h), checked: the reward's for reward.type
  // command or http, or task with reward.task set (unset: data.task's own rule, or 0 for none); the
  // cost's for cost.type command or http.
  std::optional<RewardFunctionSpec> reward_function, cost_function;
  bool reward_model = false;  // reward_model.enable
  bool cost_model = false;    // cost_model.enable
  std::optional<std::pair<double, double>> reward_clip;  // reward_model.reward_clip: [lo, hi] or none
  struct OverlongBuffer {
    bool enable = false;
    int64_t len = 0;  // in (0, the response budget] when enabled
    double penalty_factor = 1.0;
    bool log = false;
    int64_t max_resp_len = 0;  // the penalty starts at max_resp_len - len; 0 = the response budget
  } overlong_buffer;
  bool has_cost() const { return cost_model || cost_type != "none"; }
};

// global_profiler.* and each role's <role>.profiler.* (verl's keys): the steps whose worker calls run under
// libtorch's profiler, which roles and ranks, and what is recorded (runtime/call_profiler.h).
struct ProfilerRunSpec {
  struct Role {
    bool enable = false;     // <role>.profiler.enable
    bool all_ranks = false;  // <role>.profiler.all_ranks; else `ranks` (checked against the role's size later)
    std::vector<int> ranks;
    std::vector<std::string> contents;  // <role>.profiler.tool_config.torch.contents (cpu, cuda, memory, shapes, stack)
  };
  bool on = false;             // global_profiler.tool: torch or torch_memory (null: off)
  std::string tool;            // global_profiler.tool
  CudaMemoryHistoryOptions memory;  // global_profiler.global_tool_config.torch_memory
  std::vector<int64_t> steps;  // global_profiler.steps: 1-based, ascending, no repeats (torch_memory: empty = all)
  std::string save_path;       // global_profiler.save_path
  bool trace = true;           // global_profiler.trace (hybridflow's): each call's Chrome trace besides its summary
  // actor_rollout_ref.actor / .rollout / .ref, critic, reward_model.
  Role actor, rollout, ref, critic, reward_model;
  bool profiles(int64_t step) const {
    return on && ((tool == "torch_memory" && steps.empty()) || std::find(steps.begin(), steps.end(), step) != steps.end());
  }
};

struct RunSpec {
  TrainerRunSpec trainer;
  DataSpec data;
  AlgorithmSpec algorithm;
  ScoringSpec scoring;
  ProfilerRunSpec profiler;
};

}  // namespace hybridflow
