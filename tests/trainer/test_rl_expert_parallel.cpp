// Expert parallelism in the RL trainer (actor_rollout_ref.actor.megatron.expert_model_parallel_size): GRPO on a
// tiny Qwen3-MoE actor whose 8 experts split over 2 processes follows the run of the same seed on the same 2
// processes without the split (data parallel: the same generation replicas, so the same samples) within 1e-5:
// scores, losses, entropy, KL, gradient norms and the trained weights; with router replay R3 too. On 4 processes
// split 2 ways by tensor parallelism, the experts folded over each replica's tensor-parallel ranks follow both the
// tensor-parallel run without the expert split and the 2-process data-parallel run, generating with the experts
// in place; folded over both replicas' (4 ways) they follow it too. With use_dynamic_bsz the
// group's ranks run as many micro-batches as each other and the run follows the data-parallel one. PPO whose critic's experts
// split (critic.megatron.expert_model_parallel_size) follows its data-parallel run. A checkpoint saved under the
// split (also with tensor parallelism) holds every expert in the Hugging Face layout and loads into one process,
// and one saved by one process loads into the split run. With rollout expert_parallel_size 2 the rollout decodes
// expert-parallel (tokens exchanged every step) and the run still follows; the reshard metrics report the
// experts' switch in both rollout layouts. In two pipeline stages (4 processes, each stage's experts split over
// its 2 data-parallel replicas) the run follows the staged run without the split, the reshard metrics count the
// stage's experts gathered, router replay R2 follows too, and a checkpoint loads into one process; a critic split
// so in 2 stages follows its staged run. With the sequences split over the same 2 processes as the experts (and
// router replay R2) the run follows the data-parallel run. A mixture-of-experts reward model folded over its 2
// tensor-parallel ranks scores as the unsplit one. Split experts switch to another generation layout (unstaged
// from 2 stages; tensor size 1 from experts folded over both replicas' tensor ranks) through the 3D-HybridEngine
// and the runs follow theirs without the split; a standalone rollout pool takes the split experts' weights
// (sent gathered) and its runs follow theirs too. Layouts it does not cover are refused naming the keys.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "hybridflow/model/pretrained.h"
#include "hybridflow/model/safetensors.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/tasks/task.h"
#include "hybridflow/trainer/checkpoint.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/model_spec.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "support/tiny_rl_config.h"

using namespace hybridflow;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

using hybridflow::testing::error_of;
using ::testing::HasSubstr;

namespace {

constexpr int kSteps = 2;
// The token budget of the dynamic-batch-size test: rows of about 10 tokens, so a rank's 4 rows form 3 or 4
// micro-batches by their lengths (measured: the two ranks' counts differ at both steps).
constexpr int kDynamicBudget = 18;
constexpr double kTol = 1e-5;

// GRPO with a KL loss against the reference on 2 colocated processes; the qwen3-moe-tiny preset's 2 layers (the
// second routes over 8 experts), micro-batches of one sample; a reward that differs between samples.
std::vector<std::string> moe_grpo(int ep, const std::string& run_dir, const std::vector<std::string>& more = {}) {
  std::vector<std::string> o = {"model.preset=qwen3-moe-tiny",
                                "model.num_hidden_layers=2",
                                "actor_rollout_ref.num_processes=2",
                                "trainer.placement=colocate",
                                "actor_rollout_ref.actor.use_kl_loss=true",
                                "actor_rollout_ref.actor.shuffle=false",
                                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                                "actor_rollout_ref.actor.megatron.expert_model_parallel_size=" + std::to_string(ep)};
  hybridflow::testing::append_digit_reward_run(o, kSteps, run_dir, more);
  return hybridflow::testing::tiny_rl_overrides("grpo", o);
}

struct EpRun {
  std::vector<nlohmann::json> steps;
  double actor_norm = 0;
};

EpRun train(int ep, const std::vector<std::string>& more = {}) {
  hybridflow::testing::TempDir dir;
  RLTrainer trainer(load_rl_config("", moe_grpo(ep, dir.path(), more)));
  EpRun run;
  for (int step = 1; step <= kSteps; ++step) run.steps.push_back(trainer.step());
  run.actor_norm = trainer.parameter_sq_norm("actor");
  return run;
}

// `exchanges`: whether the split run's experts exchange tokens (not when folded over exactly the tensor-parallel
// ranks, which sum their experts' parts instead).
void expect_same_run(const EpRun& got, const EpRun& want, const std::string& what, bool exchanges = true) {
  ASSERT_EQ(got.steps.size(), want.steps.size());
  for (size_t i = 0; i < want.steps.size(); ++i) {
    const std::string at = what + " at step " + std::to_string(i + 1);
    for (const std::string key : {"score/mean", "response_length/mean", "actor/pg_loss", "actor/kl_loss",
                                  "actor/entropy", "actor/ppo_kl", "actor/grad_norm"}) {
      ASSERT_TRUE(got.steps[i].contains(key)) << key << " " << at;
      const double w = want.steps[i].at(key).get<double>();
      EXPECT_NEAR(got.steps[i].at(key).get<double>(), w, kTol * (1 + std::abs(w))) << key << " " << at;
    }
  }
  EXPECT_GT(want.steps.back().at("actor/kl_loss").get<double>(), 0.0) << "the actor moved";
  const std::string key = "actor/expert_parallel_all_to_all_mb";
  EXPECT_FALSE(want.steps.back().contains(key)) << key;
  ASSERT_TRUE(got.steps.back().contains(key)) << key << " " << what;
  EXPECT_EQ(got.steps.back().at(key).get<double>() > 0.0, exchanges) << what;
  EXPECT_NEAR(got.actor_norm, want.actor_norm, kTol * want.actor_norm) << what;
}

// The run's overrides without the model's shape, loading `path` instead.
std::vector<std::string> from_path(std::vector<std::string> overrides, const std::string& path) {
  std::erase_if(overrides, [](const std::string& o) { return o.rfind("model.", 0) == 0; });
  overrides.push_back("model.path=" + path);
  return overrides;
}

// One step with the experts split 2 ways (and `more`), saved under run_dir: the actor's checkpoint directory and
// its parameter norm. The Hugging Face file holds all 8 experts of the sparse layer, as one process writes it.
std::pair<std::string, double> save_split_step(const std::string& run_dir, const std::vector<std::string>& more = {},
                                               size_t experts_in_file = 8) {
  std::vector<std::string> save = {"trainer.total_steps=1", "trainer.save_freq=1"};
  save.insert(save.end(), more.begin(), more.end());
  double norm = 0;
  {
    RLTrainer trainer(load_rl_config("", moe_grpo(2, run_dir, save)));
    trainer.step();
    norm = trainer.parameter_sq_norm("actor");
  }
  const std::string actor = checkpoints_root(run_dir) + "/step_1/actor";
  std::set<std::string> experts;
  for (const auto& [name, tensor] : read_safetensors(actor + "/model.safetensors").tensors)
    if (name.find(".mlp.experts.") != std::string::npos && name.ends_with("up_proj.weight")) experts.insert(name);
  EXPECT_EQ(experts.size(), experts_in_file);
  return {actor, norm};
}

}  // namespace

TEST(RlExpertParallel, GrpoWithExpertsSplitTwoWaysFollowsTheDataParallelRun) {
  expect_same_run(train(2), train(1), "ep 2");
}

// The experts' switch to the rollout layout, as the step's reshard metrics report it: gathered (rollout
// expert_parallel_size 1), each rank sends and receives half of every expert's bytes and holds them all once;
// left in place (2), nothing moves and each rank decodes with its half, exchanging tokens with the other.
void expect_expert_reshard(const nlohmann::json& step, int rollout_ep, const std::string& what) {
  for (const std::string key : {"reshard/expert_model_bytes", "reshard/to_generation_expert_bytes_sent",
                                "reshard/to_generation_expert_bytes_received", "reshard/expert_peak_extra_weight_bytes",
                                "reshard/expert_redundant_bytes", "reshard/to_generation_bytes_sent",
                                "reshard/redundant_bytes"})
    ASSERT_TRUE(step.contains(key)) << key << " " << what;
  const double experts = step.at("reshard/expert_model_bytes").get<double>();
  EXPECT_GT(experts, 0.0) << what;
  const double moved = rollout_ep == 1 ? experts / 2 : 0.0;
  EXPECT_EQ(step.at("reshard/to_generation_expert_bytes_sent").get<double>(), moved) << what;
  EXPECT_EQ(step.at("reshard/to_generation_expert_bytes_received").get<double>(), moved) << what;
  EXPECT_EQ(step.at("reshard/to_generation_bytes_sent").get<double>(), moved) << what << ": only experts move";
  EXPECT_EQ(step.at("reshard/expert_peak_extra_weight_bytes").get<double>(), experts / rollout_ep) << what;
  EXPECT_EQ(step.at("reshard/expert_redundant_bytes").get<double>(), 0.0) << what;
  EXPECT_EQ(step.at("reshard/redundant_bytes").get<double>(), 0.0) << what;
}

// Micro-batches by token count (use_dynamic_bsz) differ in number between ranks; the ranks of an expert group
// exchange tokens in every forward and backward, so they run their group's largest count (a rank with fewer
// halves its largest micro-batches). The run follows the data-parallel one, where each rank runs its own count
// (samples, gradient norms, trained weights), and logs more micro-batches at a step where the two ranks' counts
// differ.
TEST(RlExpertParallel, GrpoWithDynamicBatchSizeRunsTheGroupsMostMicroBatchesAndFollowsTheDataParallelRun) {
  // Without balance_batch, which evens the ranks' tokens and here their counts too.
  const std::vector<std::string> dynamic = {"data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                                            "trainer.balance_batch=false",
                                            "actor_rollout_ref.actor.use_dynamic_bsz=true",
                                            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=" +
                                                std::to_string(kDynamicBudget)};
  const EpRun split = train(2, dynamic), data_parallel = train(1, dynamic);
  // The same samples, gradients and trained weights; the per-micro-batch metrics (losses, entropy) are means
  // over differently formed micro-batches, so they are not compared.
  for (size_t i = 0; i < split.steps.size(); ++i)
    for (const std::string key : {"score/mean", "response_length/mean", "actor/grad_norm"}) {
      const double w = data_parallel.steps[i].at(key).get<double>();
      EXPECT_NEAR(split.steps[i].at(key).get<double>(), w, kTol * (1 + std::abs(w))) << key << " at step " << i + 1;
    }
  EXPECT_GT(split.steps.back().at("actor/expert_parallel_all_to_all_mb").get<double>(), 0.0);
  EXPECT_NEAR(split.actor_norm, data_parallel.actor_norm, kTol * data_parallel.actor_norm);
  bool differed = false;
  for (size_t i = 0; i < split.steps.size(); ++i) {
    const double got = split.steps[i].at("actor/micro_batches").get<double>();
    const double want = data_parallel.steps[i].at("actor/micro_batches").get<double>();
    EXPECT_GE(got, want) << "step " << i + 1;
    EXPECT_EQ(got, std::round(got)) << "step " << i + 1 << ": the ranks of the expert group ran different counts";
    differed = differed || got > want;
  }
  EXPECT_TRUE(differed) << "no step had ranks with different micro-batch counts: the test no longer covers the case "
                           "(change kDynamicBudget)";
}

TEST(RlExpertParallel, GrpoWithExpertParallelDecodingFollowsTheDataParallelRun) {
  const EpRun gathered = train(2);
  const EpRun split = train(2, {"actor_rollout_ref.rollout.expert_parallel_size=2"});
  expect_same_run(split, train(1), "ep 2, rollout ep 2");
  for (size_t i = 0; i < split.steps.size(); ++i) {
    expect_expert_reshard(gathered.steps[i], 1, "rollout ep 1, step " + std::to_string(i + 1));
    expect_expert_reshard(split.steps[i], 2, "rollout ep 2, step " + std::to_string(i + 1));
  }
}

TEST(RlExpertParallel, RouterReplayR3WithExpertsSplitFollowsTheDataParallelRun) {
  const std::vector<std::string> r3 = {"actor_rollout_ref.actor.router_replay.mode=R3"};
  const EpRun split = train(2, r3);
  expect_same_run(split, train(1, r3), "ep 2, R3");
  EXPECT_TRUE(split.steps.back().contains("actor/router_replay_rollout_routing_differs"));
}

const std::vector<std::string> kTp2 = {"actor_rollout_ref.num_processes=4",
                                       "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"};

// Expert parallelism 2 under tensor parallelism 2 folds the experts over each replica's 2 tensor-parallel ranks
// (Megatron's layout): each runs its own experts and the parts are summed (no exchange), and they generate with
// the experts in place.
TEST(RlExpertParallel, GrpoWithExpertsFoldedOverTheTensorRanksFollowsTheTensorParallelRun) {
  const EpRun split = train(2, kTp2);
  expect_same_run(split, train(1, kTp2), "ep 2 x tp 2", /*exchanges=*/false);
  // And the 2-process data-parallel run: the same 2 generation replicas, each now split over 2 ranks.
  expect_same_run(split, train(1), "ep 2 x tp 2 against dp 2", /*exchanges=*/false);
  for (const nlohmann::json& step : split.steps) {
    ASSERT_TRUE(step.contains("reshard/expert_model_bytes"));
    EXPECT_GT(step.at("reshard/expert_model_bytes").get<double>(), 0.0);
    EXPECT_EQ(step.at("reshard/to_generation_expert_bytes_sent").get<double>(), 0.0) << "the experts stay in place";
    EXPECT_EQ(step.at("reshard/to_generation_expert_bytes_received").get<double>(), 0.0);
  }
}

// Expert parallelism 4 under tensor parallelism 2 on 4 processes: one group of both replicas' tensor-parallel
// ranks (2 experts each), a layout data-parallel groups cannot make (4 does not divide the 2 replicas).
TEST(RlExpertParallel, GrpoWithExpertsFoldedOverTwoReplicasTensorRanksFollowsTheTensorParallelRun) {
  expect_same_run(train(4, kTp2), train(1, kTp2), "ep 4 x tp 2");
}

// Experts folded over the tensor-parallel ranks of an actor in 2 stages (tensor parallelism 2, 4 processes), as
// verl's Qwen3-235B and DeepSeek scripts train them, generating unstaged through the 3D-HybridEngine (rollout
// pipeline size 1, tensor size 2 or 1): the generation ranks hold their block of every layer's experts, each sent
// whole by the rank that trains it, and the run follows the same layout without the expert split.
TEST(RlExpertParallel, GrpoWithFoldedExpertsInStagesGeneratingUnstagedFollowsTheRunWithoutTheSplit) {
  for (const std::string gen_tp : {"2", "1"}) {
    const std::vector<std::string> layout = {"actor_rollout_ref.num_processes=4", "model.num_hidden_layers=4",
                                             "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                                             "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
                                             "actor_rollout_ref.rollout.pipeline_model_parallel_size=1",
                                             "actor_rollout_ref.rollout.tensor_model_parallel_size=" + gen_tp,
                                             "data.train_batch_size=4"};
    const EpRun split = train(2, layout);
    expect_same_run(split, train(1, layout), "ep 2 = tp 2 in 2 stages, generating unstaged at tp " + gen_tp,
                    /*exchanges=*/false);
    EXPECT_EQ(split.steps.back().at("reshard/redundant_bytes").get<double>(), 0.0);
  }
}

// The same actor (folded experts in 2 stages) with the distributed optimizer, generating in its own stages: the
// engine treats the folded experts as the tensor-parallel split, which ZeRO and the stages combine with.
TEST(RlExpertParallel, GrpoWithFoldedExpertsInStagesAndTheDistributedOptimizerFollowsTheRunWithoutTheSplit) {
  const std::vector<std::string> layout = {"actor_rollout_ref.num_processes=4", "model.num_hidden_layers=4",
                                           "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                                           "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
                                           "actor_rollout_ref.rollout.pipeline_model_parallel_size=2",
                                           "actor_rollout_ref.actor.megatron.use_distributed_optimizer=true"};
  expect_same_run(train(2, layout), train(1, layout), "ep 2 = tp 2 in 2 stages with ZeRO", /*exchanges=*/false);
}

// A mixture-of-experts reward model (the qwen3-moe-tiny preset with a value head, the run's tokenizer).
std::string write_moe_reward_model(const std::string& dir) {
  TaskOptions options;
  const Tokenizer tokenizer = Tokenizer::from_alphabet(make_task("addition", options)->alphabet());
  nlohmann::json spec = {{"preset", "qwen3-moe-tiny"}, {"vocab_size", tokenizer.vocab_size()},
                         {"num_hidden_layers", 2},       {"init_seed", 91},
                         {"eos_token_id", tokenizer.eos_id()}, {"pad_token_id", tokenizer.pad_id()}};
  save_pretrained(dir, build_model(spec.get<ModelSpec>(), HeadKind::kValue), tokenizer);
  return dir;
}

// A mixture-of-experts reward model split over 2 tensor-parallel ranks folds its experts over them (each holds
// half and one all-reduce per sparse layer sums the parts): its scores are the unsplit reward model's.
TEST(RlExpertParallel, AMixtureOfExpertsRewardModelFoldedOverItsTensorRanksScoresAsOneProcess) {
  hybridflow::testing::TempDir models;
  const std::string rm = write_moe_reward_model(models.path() + "/rm");
  auto with_rm = [&](int tp) {
    return train(1, {"reward_model.enable=true", "reward_model.path=" + rm,
                     "reward_model.megatron.tensor_model_parallel_size=" + std::to_string(tp)});
  };
  const EpRun whole = with_rm(1), folded = with_rm(2);
  for (size_t i = 0; i < whole.steps.size(); ++i) {
    ASSERT_TRUE(folded.steps[i].contains("score/rm_mean")) << folded.steps[i].dump();
    const double want = whole.steps[i].at("score/rm_mean").get<double>();
    EXPECT_NE(want, 0.0);
    EXPECT_NEAR(folded.steps[i].at("score/rm_mean").get<double>(), want, 1e-5 * (1 + std::abs(want)));
  }
}

// The experts split over 2 processes that also split every sequence (Ulysses, or Megatron's context parallelism
// in verl's MoE configs): the 2 processes train their 4 samples as one group, each routing its slice of every
// sequence and exchanging the slices' tokens with the experts' owner. With router replay R2 (the routing
// recorded by the split old log-prob pass, replayed slice by slice in the update) it follows the data-parallel
// run without either split.
TEST(RlExpertParallel, GrpoWithExpertsAndSequencesSplitFollowsTheDataParallelRun) {
  const std::vector<std::string> r2 = {"actor_rollout_ref.actor.router_replay.mode=R2"};
  std::vector<std::string> split_r2 = r2;
  split_r2.push_back("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2");
  const EpRun split = train(2, split_r2);
  expect_same_run(split, train(1, r2), "ep 2 x sp 2, R2");
  ASSERT_TRUE(split.steps.back().contains("actor/sequence_parallel_all_to_all_mb"));
  EXPECT_GT(split.steps.back().at("actor/sequence_parallel_all_to_all_mb").get<double>(), 0.0);
}

// Two pipeline stages of 4 processes, generating in them: 4 layers (the second and fourth sparse), so that each
// stage splits the 8 experts of its one MoE layer over its 2 data-parallel replicas.
const std::vector<std::string> kTwoStages = {"actor_rollout_ref.num_processes=4", "model.num_hidden_layers=4",
                                             "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
                                             "actor_rollout_ref.rollout.pipeline_model_parallel_size=2"};

TEST(RlExpertParallel, GrpoWithExpertsSplitInPipelineStagesFollowsThePipelineRun) {
  const EpRun split = train(2, kTwoStages);
  expect_same_run(split, train(1, kTwoStages), "ep 2 x pp 2");
  // The experts gathered inside each stage: a rank sends and receives half of its stage's experts, a quarter of
  // the model's, and holds its stage's all while generating.
  for (size_t i = 0; i < split.steps.size(); ++i) {
    const nlohmann::json& step = split.steps[i];
    const std::string what = "ep 2 x pp 2 step " + std::to_string(i + 1);
    ASSERT_TRUE(step.contains("reshard/expert_model_bytes")) << what;
    const double experts = step.at("reshard/expert_model_bytes").get<double>();
    EXPECT_GT(experts, 0.0) << what;
    EXPECT_EQ(step.at("reshard/to_generation_expert_bytes_sent").get<double>(), experts / 4) << what;
    EXPECT_EQ(step.at("reshard/to_generation_expert_bytes_received").get<double>(), experts / 4) << what;
    EXPECT_EQ(step.at("reshard/to_generation_bytes_sent").get<double>(), experts / 4) << what << ": only experts move";
    EXPECT_EQ(step.at("reshard/expert_peak_extra_weight_bytes").get<double>(), experts / 2) << what;
    EXPECT_EQ(step.at("reshard/redundant_bytes").get<double>(), 0.0) << what;
  }
}

TEST(RlExpertParallel, RouterReplayR2InPipelineStagesFollowsThePipelineRun) {
  std::vector<std::string> r2 = kTwoStages;
  r2.push_back("actor_rollout_ref.actor.router_replay.mode=R2");
  const EpRun split = train(2, r2);
  expect_same_run(split, train(1, r2), "ep 2 x pp 2, R2");
  EXPECT_TRUE(split.steps.back().contains("actor/moe_expert_load_max_over_mean"));
}

// Experts split over the 2 data-parallel replicas of each of 2 stages (4 processes), generating unstaged through
// the 3D-HybridEngine, as verl's DeepSeek-671B (80 GB) and Qwen3-VL-235B scripts train in stages and generate
// unstaged: each stage gathers its experts over its group and sends them whole to the generation ranks of the
// other stage; and experts folded over both replicas' tensor ranks (ep 4 = 2 x tp 2) generating at tensor size 1.
// Each run follows the same layout without the expert split.
TEST(RlExpertParallel, GrpoWithSplitExpertsGeneratingInAnotherLayoutFollowsTheRunWithoutTheSplit) {
  const std::vector<std::string> staged = {"actor_rollout_ref.num_processes=4", "model.num_hidden_layers=4",
                                           "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
                                           "actor_rollout_ref.rollout.pipeline_model_parallel_size=1",
                                           "data.train_batch_size=4"};
  const EpRun split = train(2, staged);
  expect_same_run(split, train(1, staged), "ep 2 x pp 2 generating unstaged");
  for (const nlohmann::json& step : split.steps) {
    // Each rank sends its half of its stage's experts to the other replica and receives the other half.
    EXPECT_GT(step.at("reshard/to_generation_expert_bytes_sent").get<double>(), 0.0);
    EXPECT_EQ(step.at("reshard/to_generation_expert_bytes_sent").get<double>(),
              step.at("reshard/to_generation_expert_bytes_received").get<double>());
    EXPECT_GT(step.at("reshard/expert_model_bytes").get<double>(), 0.0);
  }
  std::vector<std::string> folded = kTp2;
  folded.insert(folded.end(), {"actor_rollout_ref.rollout.tensor_model_parallel_size=1", "data.train_batch_size=4"});
  expect_same_run(train(4, folded), train(1, folded), "ep 4 = 2 replicas x tp 2 generating at tp 1");
}

// A standalone rollout pool (one process) takes the weights of an actor whose experts split over its 2
// data-parallel replicas, or fold over its 2 tensor-parallel ranks: the actor sends them gathered, and each run
// follows its run without the split.
TEST(RlExpertParallel, AStandaloneRolloutPoolTakesTheSplitExpertsAndTheRunFollowsTheUnsplitOne) {
  const std::vector<std::string> standalone = {"trainer.placement=standalone",
                                               "actor_rollout_ref.rollout.num_processes=1"};
  expect_same_run(train(2, standalone), train(1, standalone), "ep 2 over dp, standalone rollout");
  std::vector<std::string> folded = standalone;
  folded.push_back("actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2");
  folded.push_back("actor_rollout_ref.rollout.tensor_model_parallel_size=1");
  expect_same_run(train(2, folded), train(1, folded), "ep 2 = tp 2, standalone rollout", /*exchanges=*/false);
}

// LoRA on the attention projections of a mixture-of-experts actor (experts frozen, split 2 ways): the reference is
// the actor with its adapters off, generation runs on the adapters merged in, and the run follows the data-parallel
// one.
TEST(RlExpertParallel, GrpoWithLoraOnTheAttentionOfASplitMixtureOfExpertsFollowsTheDataParallelRun) {
  const std::vector<std::string> lora = {"actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
                                         "actor_rollout_ref.model.target_modules=[q_proj,k_proj,v_proj,o_proj]",
                                         "actor_rollout_ref.actor.optim.lr=1e-2"};
  const EpRun split = train(2, lora);
  expect_same_run(split, train(1, lora), "ep 2 with LoRA");
  // Only the adapters train: a fraction of the full split run's optimizer state.
  const std::string key = "actor/optimizer_state_bytes";
  EXPECT_LT(split.steps.back().at(key).get<double>() * 5, train(2).steps.back().at(key).get<double>());
}

TEST(RlExpertParallel, ACheckpointSavedUnderExpertAndPipelineParallelismLoadsIntoOneProcess) {
  hybridflow::testing::TempDir split_dir, single_dir;
  const auto [split_actor, split_norm] = save_split_step(split_dir.path(), kTwoStages, /*experts_in_file=*/16);
  std::vector<std::string> one = from_path(moe_grpo(1, single_dir.path(), {"trainer.total_steps=1"}), split_actor);
  one.push_back("actor_rollout_ref.num_processes=1");
  RLTrainer trainer(load_rl_config("", one));
  EXPECT_NEAR(trainer.parameter_sq_norm("actor"), split_norm, 1e-9 * split_norm);
}

TEST(RlExpertParallel, ACheckpointSavedUnderExpertAndTensorParallelismLoadsIntoOneProcess) {
  hybridflow::testing::TempDir split_dir, single_dir;
  const auto [split_actor, split_norm] = save_split_step(
      split_dir.path(),
      {"actor_rollout_ref.num_processes=4", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"});
  std::vector<std::string> one = from_path(moe_grpo(1, single_dir.path(), {"trainer.total_steps=1"}), split_actor);
  one.push_back("actor_rollout_ref.num_processes=1");
  RLTrainer trainer(load_rl_config("", one));
  EXPECT_NEAR(trainer.parameter_sq_norm("actor"), split_norm, 1e-9 * split_norm);
}

// PPO whose critic's experts split `ep` ways (on `processes` processes, with `more`) against the same run without
// the split: values, value loss and gradient norms, and the actor's.
void expect_critic_split_follows(int processes, const std::vector<std::string>& more = {}) {
  auto critic = [&](int ep) {
    std::vector<std::string> o = {"algorithm.adv_estimator=gae", "critic.num_processes=" + std::to_string(processes),
                                  "critic.ppo_micro_batch_size_per_gpu=1",
                                  "critic.megatron.expert_model_parallel_size=" + std::to_string(ep)};
    o.insert(o.end(), more.begin(), more.end());
    return o;
  };
  const EpRun split = train(1, critic(2)), whole = train(1, critic(1));
  ASSERT_EQ(split.steps.size(), whole.steps.size());
  for (size_t i = 0; i < whole.steps.size(); ++i)
    for (const std::string key : {"values/mean", "critic/vf_loss", "critic/vpred_mean", "critic/grad_norm",
                                  "actor/pg_loss", "actor/grad_norm"}) {
      ASSERT_TRUE(split.steps[i].contains(key)) << key;
      const double w = whole.steps[i].at(key).get<double>();
      EXPECT_NEAR(split.steps[i].at(key).get<double>(), w, kTol * (1 + std::abs(w))) << key << " at step " << i + 1;
    }
  const std::string key = "critic/expert_parallel_all_to_all_mb";
  ASSERT_TRUE(split.steps.back().contains(key)) << key;
  EXPECT_GT(split.steps.back().at(key).get<double>(), 0.0);
  EXPECT_FALSE(whole.steps.back().contains(key)) << key;
}

TEST(RlExpertParallel, PpoWithTheCriticsExpertsSplitFollowsTheDataParallelRun) { expect_critic_split_follows(2); }

// The critic in 2 stages of 2 data-parallel replicas (4 layers: one MoE layer per stage).
TEST(RlExpertParallel, PpoWithTheCriticsExpertsSplitInPipelineStagesFollowsThePipelineRun) {
  expect_critic_split_follows(4, {"actor_rollout_ref.num_processes=4", "data.train_batch_size=4",
                                  "model.num_hidden_layers=4", "critic.megatron.pipeline_model_parallel_size=2"});
}

TEST(RlExpertParallel, CheckpointsMoveBetweenTheSplitAndOneProcess) {
  hybridflow::testing::TempDir split_dir, single_dir;
  // Two processes, experts split: one step, saved.
  const std::vector<std::string> save = {"trainer.total_steps=1", "trainer.save_freq=1"};
  const auto [split_actor, split_norm] = save_split_step(split_dir.path());
  // Into one process.
  double single_norm = 0;
  {
    std::vector<std::string> one = from_path(moe_grpo(1, single_dir.path(), save), split_actor);
    one.push_back("actor_rollout_ref.num_processes=1");
    RLTrainer trainer(load_rl_config("", one));
    EXPECT_NEAR(trainer.parameter_sq_norm("actor"), split_norm, 1e-9 * split_norm);
    trainer.step();
    single_norm = trainer.parameter_sq_norm("actor");
  }
  // And back into the split.
  hybridflow::testing::TempDir back_dir;
  RLTrainer back(load_rl_config(
      "", from_path(moe_grpo(2, back_dir.path(), save), checkpoints_root(single_dir.path()) + "/step_1/actor")));
  EXPECT_NEAR(back.parameter_sq_norm("actor"), single_norm, 1e-9 * single_norm);
}

TEST(RlExpertParallel, LayoutsItDoesNotCoverAreRefusedNamingTheKeys) {
  hybridflow::testing::TempDir dir;
  auto refused = [&](int ep, const std::vector<std::string>& more) {
    return error_of([&] { RLTrainer t(load_rl_config("", moe_grpo(ep, dir.path(), more))); });
  };
  // Decoding with the experts in place needs the actor's own layout; another one switches in hybridflow mode.
  const std::vector<std::string> unstaged = {"actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
                                             "actor_rollout_ref.num_processes=4", "data.train_batch_size=4"};
  std::vector<std::string> unstaged_in_place = unstaged;
  unstaged_in_place.push_back("actor_rollout_ref.rollout.expert_parallel_size=2");
  EXPECT_THAT(refused(2, unstaged_in_place),
              HasSubstr("actor_rollout_ref.rollout.expert_parallel_size = 2 decodes with the experts where training "
                        "keeps them, in the actor's own layout"));
  std::vector<std::string> unstaged_vanilla = unstaged;
  unstaged_vanilla.push_back("actor_rollout_ref.rollout.reshard_mode=hybridflow-v");
  EXPECT_THAT(refused(2, unstaged_vanilla),
              HasSubstr("actor_rollout_ref.rollout.reshard_mode = hybridflow-v: the actor's experts"));
  // LoRA's default all-linear would reach the experts: refused before any worker starts.
  EXPECT_THAT(refused(1, {"actor_rollout_ref.model.lora_rank=4"}),
              HasSubstr("actor_rollout_ref.model.target_modules: all-linear on a mixture-of-experts model"));
  EXPECT_THAT(refused(1, {"algorithm.adv_estimator=gae", "critic.model.lora_rank=4"}),
              HasSubstr("critic.model.target_modules: all-linear on a mixture-of-experts model"));
  std::vector<std::string> staged_decoding = kTwoStages;
  staged_decoding.push_back("actor_rollout_ref.rollout.expert_parallel_size=2");
  EXPECT_THAT(refused(2, staged_decoding),
              HasSubstr("actor_rollout_ref.rollout.expert_parallel_size = 2: expert-parallel decoding runs unstaged"));
  std::vector<std::string> staged_zero = kTwoStages;
  staged_zero.push_back("actor_rollout_ref.actor.megatron.use_distributed_optimizer=true");
  EXPECT_THAT(refused(2, staged_zero),
              HasSubstr("actor_rollout_ref.actor.megatron.pipeline_model_parallel_size = 2 and "
                        "actor_rollout_ref.actor.megatron.use_distributed_optimizer = true: expert parallelism "
                        "over data-parallel ranks is combined with pipeline stages or with the distributed optimizer, "
                        "not yet with both"));
  EXPECT_THAT(refused(2, {"actor_rollout_ref.ref.megatron.expert_model_parallel_size=1"}),
              HasSubstr("actor_rollout_ref.ref.megatron.expert_model_parallel_size = 1"));
  EXPECT_THAT(refused(2, {"actor_rollout_ref.num_processes=1"}),
              HasSubstr("expert_model_parallel_size = 2 does not divide the role's 1 data-parallel processes"));
  EXPECT_THAT(refused(1, {"actor_rollout_ref.rollout.expert_parallel_size=2"}),
              HasSubstr("actor_rollout_ref.rollout.expert_parallel_size = 2 must be 1"));
  EXPECT_THAT(refused(2, {"actor_rollout_ref.rollout.expert_parallel_size=4"}),
              HasSubstr("actor_rollout_ref.rollout.expert_parallel_size = 4 must be 1"));
  EXPECT_THAT(refused(4, {"actor_rollout_ref.rollout.expert_parallel_size=4", "actor_rollout_ref.num_processes=4",
                          "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"}),
              HasSubstr("actor_rollout_ref.rollout.expert_parallel_size = 4: expert-parallel decoding is not combined "
                        "with tensor parallelism"));
  EXPECT_THAT(refused(8, {"actor_rollout_ref.num_processes=4",
                          "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"}),
              HasSubstr("actor_rollout_ref.actor.megatron.expert_model_parallel_size = 8 does not divide the role's 2 "
                        "data-parallel processes and is not a multiple of tensor_model_parallel_size 2 dividing them"));
  // Folded over exactly the tensor-parallel ranks, the experts stay in place for decoding whichever size is set.
  EXPECT_NO_THROW(RLTrainer::check(load_rl_config(
      "", moe_grpo(2, dir.path(),
                   {"actor_rollout_ref.rollout.expert_parallel_size=2", "actor_rollout_ref.num_processes=4",
                    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                    "actor_rollout_ref.actor.router_replay.mode=R3"}))));
  EXPECT_THAT(refused(2, {"actor_rollout_ref.rollout.expert_parallel_size=2",
                          "actor_rollout_ref.actor.router_replay.mode=R3"}),
              HasSubstr("actor_rollout_ref.rollout.expert_parallel_size = 2: expert-parallel decoding runs single-turn "
                        "rollouts without recording the routing"));
}
