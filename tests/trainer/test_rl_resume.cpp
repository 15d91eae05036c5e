// Checkpoints of the RL trainer and resuming from them over real worker processes: a run interrupted
// after its step-2 checkpoint and resumed must reproduce an uninterrupted run's metrics and weights
// bit for bit; incomplete checkpoints are never resumed from; only the newest K are kept.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <filesystem>
#include <fstream>

#include "hybridflow/core/fs.h"
#include "hybridflow/core/jsonl.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/checkpoint.h"
#include "hybridflow/trainer/metrics_log.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/deterministic_metrics.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "support/tiny_rl_config.h"

using namespace hybridflow;
namespace fs = std::filesystem;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

namespace {

std::vector<std::string> tiny_run(const std::string& estimator, const std::string& run_dir,
                                  std::vector<std::string> extra = {}) {
  // Two shuffled mini-batches per epoch, two epochs: the optimizer step counter (which seeds the
  // shuffle) and the Adam moments both matter.
  std::vector<std::string> o = {"actor_rollout_ref.actor.ppo_mini_batch_size=1",
                                "actor_rollout_ref.actor.ppo_epochs=2",
                                "actor_rollout_ref.actor.optim.lr_warmup_steps=3",
                                "critic.ppo_mini_batch_size=1",
                                "critic.ppo_epochs=2",
                                "trainer.total_steps=4",
                                "trainer.run_dir=" + run_dir};
  o.insert(o.end(), extra.begin(), extra.end());
  return hybridflow::testing::tiny_rl_overrides(estimator, o);
}

// A record without the wall-clock metrics, which legitimately differ between runs: timing/*, throughput,
// seconds elsewhere (named *_s, e.g. actor/dp_allreduce_s), and the processes' memory (memory/*: a
// resumed process has not reached the peak the interrupted one had), and the bytes each transport path
// moved (a resumed standalone rollout's prefetched batch comes from the checkpoint, not the data plane).
nlohmann::json deterministic_part(const nlohmann::json& record) {
  return hybridflow::testing::deterministic_metrics(record);
}

struct RunEnd {
  std::vector<nlohmann::json> metrics;  // metrics.jsonl, deterministic part
  std::vector<double> sq_norms;         // per trained role
  std::map<std::string, int> prompt_uses;  // samples trained per prompt (samples.jsonl, when every sample is logged)
};

RunEnd finish(RLTrainer& trainer, const std::string& run_dir) {
  trainer.fit();
  RunEnd end;
  for (const auto& record : read_jsonl(run_dir + "/metrics.jsonl")) end.metrics.push_back(deterministic_part(record));
  for (const std::string& role : trainer.roles()) end.sq_norms.push_back(trainer.parameter_sq_norm(role));
  if (fs::exists(run_dir + "/samples.jsonl"))
    for (const auto& sample : read_jsonl(run_dir + "/samples.jsonl")) ++end.prompt_uses[sample.at("prompt").get<std::string>()];
  return end;
}

// 4 steps straight vs 3 steps (checkpoint after step 2, then a "crash" after step 3's metrics were
// written) and a new trainer that resumes from step 2 and runs steps 3-4.
void expect_resume_reproduces_straight_run(const std::string& estimator, const std::vector<std::string>& extra,
                                           const std::vector<std::string>& roles) {
  std::vector<std::string> opts = extra;
  opts.push_back("trainer.save_freq=2");
  hybridflow::testing::TempDir straight_dir, resumed_dir;
  RunEnd straight;
  {
    RLTrainer trainer(load_rl_config("", tiny_run(estimator, straight_dir.path(), opts)));
    EXPECT_EQ(trainer.roles(), roles);
    straight = finish(trainer, straight_dir.path());
  }
  {
    RLTrainer trainer(load_rl_config("", tiny_run(estimator, resumed_dir.path(), opts)));
    EXPECT_EQ(trainer.resumed_from(), "");
    for (int i = 0; i < 3; ++i) trainer.step();
    EXPECT_EQ(trainer.last_checkpoint(), checkpoints_root(resumed_dir.path()) + "/step_2");
  }
  RunEnd resumed;
  {
    RLTrainer trainer(load_rl_config("", tiny_run(estimator, resumed_dir.path(), opts)));
    EXPECT_EQ(trainer.resumed_from(), checkpoints_root(resumed_dir.path()) + "/step_2");
    EXPECT_EQ(trainer.steps_done(), 2);
    resumed = finish(trainer, resumed_dir.path());
    EXPECT_EQ(trainer.steps_done(), 4);
  }
  ASSERT_EQ(straight.metrics.size(), 4u);
  if (straight.metrics[2].contains("actor/reward_kl_coef")) {  // the adaptive controller moved: restoring it matters
    EXPECT_NE(straight.metrics[2].at("actor/reward_kl_coef").get<double>(), 0.1);
  }
  ASSERT_EQ(resumed.metrics.size(), 4u) << "step 3 of the interrupted run must not stay in metrics.jsonl";
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(resumed.metrics[i].at("step"), static_cast<int64_t>(i + 1));
    EXPECT_EQ(resumed.metrics[i], straight.metrics[i]) << estimator << " step " << i + 1;
  }
  // The updates changed the weights, so equal norms say the same updates were applied.
  EXPECT_EQ(resumed.sq_norms, straight.sq_norms);
  // Every prompt trained as often as in the straight run: none lost, none duplicated by the resume.
  EXPECT_EQ(resumed.prompt_uses, straight.prompt_uses);
  EXPECT_TRUE(is_complete_checkpoint(checkpoints_root(resumed_dir.path()) + "/step_4"));
  // Only an off-policy run has rollouts in flight at a checkpoint: with staleness k those of the next
  // min(k, steps left) steps (and none after its last step).
  int staleness = 0;
  for (const std::string& o : extra)
    if (o.rfind("actor_rollout_ref.rollout.staleness=", 0) == 0) staleness = std::stoi(o.substr(o.find('=') + 1));
  const std::string step2 = checkpoints_root(resumed_dir.path()) + "/step_2/rollout_in_flight.bin";
  EXPECT_EQ(fs::exists(step2), staleness >= 1);
  EXPECT_EQ(fs::exists(step2 + ".1"), staleness >= 2);  // steps 3 and 4 of 4
  EXPECT_FALSE(fs::exists(step2 + ".2"));
  EXPECT_FALSE(fs::exists(checkpoints_root(resumed_dir.path()) + "/step_4/rollout_in_flight.bin"));
}

}  // namespace

TEST(RlResume, GrpoResumedRunMatchesAnUninterruptedOne) {
  // A graded reward (digits in the response), so that group advantages are not all zero and the
  // actor's updates depend on every sample.
  const std::string scorer =
      "reward.shell=/usr/bin/python3 -c \"import sys,json; [print(sum(c.isdigit() for c in "
      "json.loads(l)['response']) / 4.0, flush=True) for l in sys.stdin]\"";
  expect_resume_reproduces_straight_run("grpo", {"reward.type=command", scorer}, {"actor"});
}

TEST(RlResume, PpoWithCriticAndAdaptiveKlResumedRunMatchesAnUninterruptedOne) {
  expect_resume_reproduces_straight_run("gae",
                                        {"algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive",
                                         "algorithm.kl_ctrl.kl_coef=0.1", "algorithm.kl_ctrl.target_kl=0.01",
                                         "algorithm.kl_ctrl.horizon=10", "algorithm.gamma=0.99",
                                         "algorithm.lam=0.95"},
                                        {"actor", "critic"});
}

TEST(RlResume, PpoWithLoraActorAndCriticResumedRunMatchesAnUninterruptedOne) {
  // The adapters, their moments and the critic's value head come back from <role>/lora_adapter and the
  // optimizer files; the reference (the actor with its adapters off) runs for the KL loss.
  expect_resume_reproduces_straight_run("gae",
                                        {"actor_rollout_ref.model.lora_rank=4", "critic.model.lora_rank=4",
                                         "critic.model.target_modules=[q_proj,v_proj]",
                                         "actor_rollout_ref.actor.use_kl_loss=true"},
                                        {"actor", "critic"});
}

TEST(RlResume, DataParallelActorResumedRunMatchesAnUninterruptedOne) {
  // Two ranks: rank 0 writes the weights and optimizer state, both ranks read them back and each restores
  // its own generator state.
  expect_resume_reproduces_straight_run("grpo", {"actor_rollout_ref.num_processes=2", "actor_rollout_ref.actor.entropy_coeff=0.01"},
                                        {"actor"});
}

TEST(RlResume, SafeRlhfResumedRunMatchesAnUninterruptedOne) {
  // A rule cost most responses incur, so the multiplier moves every step after the delay; the cost
  // critic is a third trained role.
  expect_resume_reproduces_straight_run("gae",
                                        {"cost.type=contains", "cost.contains=['1','2','3','4','5']",
                                         "algorithm.safe_rlhf.lambda_lr=0.5",
                                         "algorithm.safe_rlhf.lambda_update_delay_steps=1"},
                                        {"actor", "critic", "cost_critic"});
}

TEST(RlResume, OneStepOffPolicyStandaloneRolloutResumedRunMatchesAnUninterruptedOne) {
  // The step-2 checkpoint holds step 3's rollout, generated during step 2 by the weights of step 1 (which
  // the checkpoint does not hold): the resumed run must train step 3 on exactly that batch.
  expect_resume_reproduces_straight_run("gae",
                                        {"trainer.placement=standalone", "actor_rollout_ref.rollout.staleness=1",
                                         "algorithm.rollout_correction.rollout_is=token"},
                                        {"actor", "critic", "rollout"});
}

TEST(RlResume, StreamingRolloutsOfStalenessTwoAndThreeResumeLosingAndDuplicatingNoPrompt) {
  // The step-2 checkpoint holds the rollouts of steps 3 and 4, generated by older weights; every sample is
  // logged (samples.jsonl) so that each prompt's uses are counted in both runs.
  for (const char* k : {"2", "3"}) {
    SCOPED_TRACE(std::string("staleness ") + k);
    expect_resume_reproduces_straight_run("gae",
                                          {"trainer.placement=standalone",
                                           std::string("actor_rollout_ref.rollout.staleness=") + k,
                                           "trainer.log_samples_freq=1", "trainer.log_samples_count=64"},
                                          {"actor", "critic", "rollout"});
  }
  // The straight run's prompt uses themselves: 4 steps of 2 prompts, 2 samples each, all distinct.
  hybridflow::testing::TempDir dir;
  RLTrainer trainer(load_rl_config(
      "", tiny_run("gae", dir.path(),
                   {"trainer.placement=standalone", "actor_rollout_ref.rollout.staleness=2", "trainer.log_samples_freq=1",
                    "trainer.log_samples_count=64"})));
  const RunEnd end = finish(trainer, dir.path());
  EXPECT_EQ(end.prompt_uses.size(), 8u);
  for (const auto& [prompt, uses] : end.prompt_uses) EXPECT_EQ(uses, 2) << prompt;
}

TEST(RlResume, IncompleteCheckpointsAreNeverResumedFrom) {
  hybridflow::testing::TempDir dir;
  const std::string root = checkpoints_root(dir.path());
  {
    RLTrainer trainer(load_rl_config("", tiny_run("grpo", dir.path(), {"trainer.total_steps=2", "trainer.save_freq=1"})));
    trainer.fit();
  }
  EXPECT_EQ(read_file(root + "/latest"), "step_2\n");
  // A crash between writing the files and the marker: `latest` still names step_2, but it is incomplete.
  fs::remove(root + "/step_2/" + kCheckpointCompleteFile);
  // A crash while writing step 3: only its temporary directory exists.
  fs::create_directories(root + "/.step_3.tmp/actor");
  {
    RLTrainer trainer(load_rl_config("", tiny_run("grpo", dir.path())));
    EXPECT_EQ(trainer.resumed_from(), root + "/step_1");
    EXPECT_EQ(trainer.steps_done(), 1);
  }
  const std::string message = hybridflow::testing::error_of([&] {
    RLTrainer trainer(load_rl_config("", tiny_run("grpo", dir.path(), {"trainer.resume_mode=resume_path",
                                                                       "trainer.resume_from_path=" + root + "/step_2"})));
  });
  EXPECT_NE(message.find("step_2/COMPLETE"), std::string::npos) << message;
}

TEST(RlResume, CorruptOrMissingCheckpointsGiveErrorsNamingTheFile) {
  hybridflow::testing::TempDir dir;
  const std::string root = checkpoints_root(dir.path());
  {
    RLTrainer trainer(load_rl_config("", tiny_run("grpo", dir.path(), {"trainer.total_steps=1", "trainer.save_checkpoint=true"})));
    trainer.fit();
  }
  // A GRPO checkpoint cannot seed a PPO run: the critic would start untrained behind a resumed actor.
  // (Checked while the checkpoint is intact: a damaged one is refused before its roles are compared.)
  std::string message = hybridflow::testing::error_of([&] {
    RLTrainer trainer(load_rl_config("", tiny_run("gae", dir.path(), {"trainer.resume_mode=resume_path",
                                                                      "trainer.resume_from_path=" + root + "/step_1"})));
  });
  EXPECT_NE(message.find("trainer_state.json"), std::string::npos) << message;

  write_file_atomic(root + "/step_1/trainer_state.json", "{\"step\": 1,");
  message = hybridflow::testing::error_of([&] { RLTrainer trainer(load_rl_config("", tiny_run("grpo", dir.path()))); });
  EXPECT_NE(message.find("step_1/trainer_state.json"), std::string::npos) << message;

  write_file_atomic(root + "/step_1/trainer_state.json", R"({"step": 1, "data_pos": 2, "roles": ["actor"], "kl_coef": 0.001})");
  fs::remove(root + "/step_1/actor_optim.safetensors");
  message = hybridflow::testing::error_of([&] { RLTrainer trainer(load_rl_config("", tiny_run("grpo", dir.path()))); });
  EXPECT_NE(message.find("actor_optim.safetensors"), std::string::npos) << message;

  message = hybridflow::testing::error_of([&] {
    RLTrainer trainer(load_rl_config("", tiny_run("grpo", dir.path(), {"trainer.resume_mode=resume_path",
                                                                       "trainer.resume_from_path=" + dir.path() + "/nope"})));
  });
  EXPECT_NE(message.find(dir.path() + "/nope"), std::string::npos) << message;

  message = hybridflow::testing::error_of(
      [&] { RLTrainer trainer(load_rl_config("", tiny_run("grpo", "", {"trainer.save_freq=2"}))); });
  EXPECT_NE(message.find("trainer.run_dir"), std::string::npos) << message;

}

TEST(RlResume, KeepsTheLastKCheckpointsAsModelDirectories) {
  hybridflow::testing::TempDir dir;
  const std::string root = checkpoints_root(dir.path());
  RLTrainer trainer(load_rl_config(
      "", tiny_run("grpo", dir.path(), {"trainer.save_freq=1", "trainer.max_ckpt_to_keep=2", "trainer.resume_mode=disable"})));
  trainer.fit();
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(root)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step_3", "step_4"}));
  EXPECT_EQ(trainer.last_checkpoint(), root + "/step_4");
  for (const char* file : {"actor/config.json", "actor/model.safetensors", "actor/tokenizer.json", "actor_optim.safetensors",
                           "rng/actor_rank0.safetensors", "trainer_state.json", "COMPLETE"})
    EXPECT_TRUE(file_exists(root + "/step_4/" + file)) << file;
  EXPECT_EQ(read_trainer_state(root + "/step_4").at("step"), 4);
}

TEST(RlResume, MetricsAfterTheCheckpointAndACutOffLineAreDropped) {
  hybridflow::testing::TempDir dir;
  MetricsLog log(dir.path());
  for (int64_t step = 1; step <= 3; ++step) {
    log.set("score/mean", static_cast<double>(step));
    log.end_step(step);
  }
  {
    std::ofstream out(log.path(), std::ios::app);
    out << "{\"step\": 4, \"score/me";  // the crash cut this line short
  }
  EXPECT_EQ(log.drop_steps_after(2), 2);
  const auto records = read_jsonl(log.path());
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[1].at("step"), 2);
  EXPECT_EQ(records[1].at("score/mean"), 2.0);
  EXPECT_EQ(log.drop_steps_after(2), 0);
}

TEST(RlResume, ASecondSaveOfTheSameStepReplacesTheFirst) {
  hybridflow::testing::TempDir dir;
  const std::string root = checkpoints_root(dir.path());
  for (const char* content : {"first", "second"}) {
    const std::string tmp = begin_checkpoint(root, 5);
    write_file_atomic(tmp + "/payload", content);
    EXPECT_EQ(commit_checkpoint(root, 5, tmp), root + "/step_5");
  }
  EXPECT_EQ(read_file(root + "/step_5/payload"), "second");
  EXPECT_EQ(remove_old_checkpoints(root, 1), 0);
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(root)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step_5"})) << "the moved-aside copy must be cleaned up";
  EXPECT_EQ(find_latest_checkpoint(root), root + "/step_5");  // (not intact: it holds only a payload)
}
