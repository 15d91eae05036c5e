// The RL trainer end to end over real worker processes (this binary re-executes itself as the
// workers): which groups each estimator starts, that a step changes the models, and the metrics.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/jsonl.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/tasks/dataset.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "support/tiny_rl_config.h"

using namespace hybridflow;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

using hybridflow::testing::error_of;
using hybridflow::testing::tiny_rl_overrides;

TEST(RlTrainer, GrpoStartsNoCriticAndAStepChangesTheActor) {
  hybridflow::testing::TempDir dir;
  RLTrainer trainer(load_rl_config("", tiny_rl_overrides("grpo", {"trainer.run_dir=" + dir.path()})));
  EXPECT_EQ(trainer.roles(), (std::vector<std::string>{"actor"}));
  EXPECT_THROW(trainer.parameter_sq_norm("critic"), Error);
  // The resolved config is in the run directory before the first step.
  const std::string written = read_file(dir.path() + "/config.yaml");
  EXPECT_NE(written.find("adv_estimator: \"grpo\""), std::string::npos) << written;
  const double before = trainer.parameter_sq_norm("actor");
  nlohmann::json record = trainer.fit();
  EXPECT_EQ(trainer.steps_done(), 2);
  EXPECT_NE(trainer.parameter_sq_norm("actor"), before);
  for (const char* key : {"score/mean", "actor/pg_loss", "actor/entropy", "response_length/mean",
                          "timing/generate_s", "timing/update_actor_s", "perf/throughput_tokens_per_s"})
    EXPECT_TRUE(record.contains(key)) << key << " missing in " << record.dump();
  EXPECT_FALSE(record.contains("critic/vf_loss"));
  const double score = record.at("score/mean").get<double>();
  EXPECT_GE(score, 0.0);
  EXPECT_LE(score, 1.0);
  auto lines = read_jsonl(dir.path() + "/metrics.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[1].at("step"), 2);
  // The default logger list also writes TensorBoard event files (tests/report reads them back).
  int event_files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path() + "/tensorboard")) {
    EXPECT_EQ(entry.path().filename().string().rfind("events.out.tfevents.", 0), 0u) << entry.path();
    EXPECT_GT(std::filesystem::file_size(entry.path()), 100u);
    ++event_files;
  }
  EXPECT_EQ(event_files, 1);
  const double accuracy = trainer.evaluate(4);
  EXPECT_GE(accuracy, 0.0);
  EXPECT_LE(accuracy, 1.0);
}

TEST(RlTrainer, PpoWithGaeStartsACriticAndUpdatesIt) {
  RLTrainer trainer(load_rl_config(
      "", tiny_rl_overrides("gae", {"algorithm.use_kl_in_reward=true", "algorithm.gamma=0.99", "algorithm.lam=0.95"})));
  EXPECT_EQ(trainer.roles(), (std::vector<std::string>{"actor", "critic"}));
  const double critic_before = trainer.parameter_sq_norm("critic");
  nlohmann::json record = trainer.step();
  EXPECT_NE(trainer.parameter_sq_norm("critic"), critic_before);
  for (const char* key : {"critic/vf_loss", "values/mean", "timing/values_s", "timing/update_critic_s",
                          "actor/reward_kl_penalty", "actor/ref_kl", "timing/ref_s"})
    EXPECT_TRUE(record.contains(key)) << key << " missing in " << record.dump();
  // Actor and reference start equal, so the first step's KL penalty is 0.
  EXPECT_NEAR(record.at("actor/reward_kl_penalty").get<double>(), 0.0, 1e-5);
}

TEST(RlTrainer, Bf16RolesTrainAndAMisspelledDtypeNamesItsKey) {
  // Actor and critic train in bf16, generation runs on an fp32 cast copy, the reference in bf16.
  RLTrainer trainer(load_rl_config(
      "", tiny_rl_overrides("gae", {"actor_rollout_ref.actor.dtype=bf16", "actor_rollout_ref.rollout.dtype=fp32",
                                    "critic.dtype=bf16", "actor_rollout_ref.actor.use_kl_loss=true"})));
  const double actor_before = trainer.parameter_sq_norm("actor");
  const double critic_before = trainer.parameter_sq_norm("critic");
  nlohmann::json record = trainer.fit();
  EXPECT_NE(trainer.parameter_sq_norm("actor"), actor_before);
  EXPECT_NE(trainer.parameter_sq_norm("critic"), critic_before);
  for (const char* key : {"actor/pg_loss", "actor/kl_loss", "critic/vf_loss", "actor/entropy"}) {
    ASSERT_TRUE(record.contains(key)) << key << " missing in " << record.dump();
    EXPECT_TRUE(std::isfinite(record.at(key).get<double>())) << key;
  }
  const std::string bad = error_of([] { RLTrainer t(load_rl_config("", tiny_rl_overrides("grpo", {"critic.dtype=bfloat17"}))); });
  EXPECT_NE(bad.find("critic.dtype"), std::string::npos) << bad;
}

TEST(RlTrainer, LoggerListPicksTheSinksAndNamesAnUnknownOne) {
  hybridflow::testing::TempDir dir;
  // verl configs often name wandb: skipped with a warning, the run goes on with the sinks listed.
  RLTrainer trainer(load_rl_config(
      "", tiny_rl_overrides("grpo", {"trainer.run_dir=" + dir.path(), "trainer.logger=[console, wandb]",
                                     "trainer.total_steps=1"})));
  trainer.fit();
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/metrics.jsonl"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/tensorboard"));
  const std::string bad = error_of(
      [] { RLTrainer t(load_rl_config("", tiny_rl_overrides("grpo", {"trainer.logger=[console, tensorbord]"}))); });
  EXPECT_NE(bad.find("trainer.logger"), std::string::npos) << bad;
  EXPECT_NE(bad.find("tensorbord"), std::string::npos) << bad;
}

// One sample per prompt: as in verl, a group of one has baseline 0, so the run trains on the raw scores (the
// estimators' groups of one are tested in tests/algo); the trainer warns instead of refusing.
TEST(RlTrainer, GroupEstimatorsWithOneSamplePerPromptWarnAndTrain) {
  for (const std::string estimator : {"grpo", "rloo"}) {
    ::testing::internal::CaptureStderr();
    RLTrainer trainer(load_rl_config("", tiny_rl_overrides(estimator, {"actor_rollout_ref.rollout.n=1"})));
    const nlohmann::json step = trainer.step();
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("algorithm.adv_estimator=" + estimator + " with actor_rollout_ref.rollout.n = 1"),
              std::string::npos)
        << err;
    EXPECT_TRUE(step.contains("actor/pg_loss")) << estimator << ": " << step.dump();
  }
}

TEST(RlTrainer, CriticFreeEstimatorsRunAStepEach) {
  for (const std::string estimator :
       {"rloo", "reinforce_plus_plus", "remax", "optimal_token_baseline", "tir_optimal_token_baseline"}) {
    RLTrainer trainer(load_rl_config("", tiny_rl_overrides(estimator, {"actor_rollout_ref.actor.use_kl_loss=true"})));
    EXPECT_EQ(trainer.roles(), (std::vector<std::string>{"actor"})) << estimator;
    nlohmann::json record = trainer.step();
    EXPECT_TRUE(record.contains("actor/kl_loss")) << estimator << ": " << record.dump();
    EXPECT_EQ(record.contains("score/greedy_baseline_mean"), estimator == "remax") << estimator;
  }
}

// verl's profiler keys: the chosen step's calls of the enabled role, traced with the update's phases named.
TEST(RlTrainer, GlobalProfilerTracesTheChosenStepOfTheEnabledRole) {
  hybridflow::testing::TempDir dir;
  const std::vector<std::string> profile = {"global_profiler.tool=torch", "global_profiler.steps=[2]",
                                            "global_profiler.save_path=" + dir.path(),
                                            "actor_rollout_ref.actor.profiler.enable=true",
                                            "actor_rollout_ref.actor.profiler.ranks=[0]"};
  std::vector<std::string> overrides = profile;
  overrides.push_back("trainer.total_steps=3");
  RLTrainer trainer(load_rl_config("", tiny_rl_overrides("grpo", overrides)));
  trainer.fit();
  EXPECT_FALSE(std::filesystem::exists(dir.file("step_1")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("step_3")));
  std::map<std::string, nlohmann::json> by_method;
  std::istringstream lines(read_file(dir.file("step_2/actor_rank0.summary.jsonl")));
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    by_method[j.at("method").get<std::string>()] = j;
    EXPECT_TRUE(file_exists(j.at("trace").get<std::string>())) << line;
  }
  // The actor's section: its update and its old log-probs, not the generation (the rollout's section is off).
  ASSERT_TRUE(by_method.count("update_actor")) << dir.path();
  EXPECT_TRUE(by_method.count("compute_log_prob"));
  EXPECT_FALSE(by_method.count("generate_sequences"));
  const nlohmann::json& scopes = by_method["update_actor"]["scopes"];
  for (const char* phase : {"hf::train_step", "hf::forward_and_loss", "hf::policy_log_probs", "hf::backward",
                            "hf::clip_grad_norm", "hf::optimizer_step"})
    EXPECT_GE(scopes.value(phase, nlohmann::json::object()).value("calls", 0.0), 1.0) << phase << ": " << scopes.dump();
  // The update's phases lie inside it.
  EXPECT_LE(scopes["hf::backward"]["host_s"].get<double>(), by_method["update_actor"]["wall_s"].get<double>());

  // Unset, the save path is the run directory's profile/, where `hybridflow report` looks.
  hybridflow::testing::TempDir run_dir;
  RLTrainer in_run_dir(load_rl_config(
      "", tiny_rl_overrides("grpo", {"global_profiler.tool=torch", "global_profiler.steps=[1]",
                                     "global_profiler.trace=false", "actor_rollout_ref.actor.profiler.enable=true",
                                     "actor_rollout_ref.actor.profiler.ranks=[0]", "trainer.total_steps=1",
                                     "trainer.run_dir=" + run_dir.path()})));
  in_run_dir.fit();
  EXPECT_TRUE(file_exists(run_dir.file("profile/step_1/actor_rank0.summary.jsonl")));
  EXPECT_FALSE(file_exists(run_dir.file("profile/step_1/actor_rank0_update_actor_1.trace.json")));

  auto fails = [&](std::vector<std::string> extra) {
    return error_of([&] { RLTrainer t(load_rl_config("", tiny_rl_overrides("grpo", extra))); });
  };
  std::string msg = fails({"global_profiler.tool=nsys", "global_profiler.steps=[2]"});
  EXPECT_NE(msg.find("global_profiler.tool: 'nsys' is not supported"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nsys profile hybridflow train"), std::string::npos) << msg;
  msg = fails({"global_profiler.tool=torch", "global_profiler.steps=[2]"});
  EXPECT_NE(msg.find("no role's profiler is enabled"), std::string::npos) << msg;
  msg = fails({"global_profiler.tool=torch", "global_profiler.steps=[2]", "critic.profiler.enable=true"});
  EXPECT_NE(msg.find("critic.profiler.enable is true but critic.profiler.ranks is empty"), std::string::npos) << msg;
  msg = fails({"global_profiler.tool=torch", "global_profiler.steps=[2, 1]",
               "actor_rollout_ref.actor.profiler.all_ranks=true", "actor_rollout_ref.actor.profiler.enable=true"});
  EXPECT_NE(msg.find("global_profiler.steps: expected ascending step numbers from 1"), std::string::npos) << msg;
  std::vector<std::string> far = profile;
  far.push_back("actor_rollout_ref.actor.profiler.ranks=[3]");
  msg = fails(far);
  EXPECT_NE(msg.find("actor_rollout_ref.actor.profiler.ranks: rank 3 is out of range: role 'actor' has 1 rank"),
            std::string::npos) << msg;
}

// Tool torch_memory as verl's configs set it (no steps, no role section): every step, every rank of the actor's
// processes; a role section narrows it. On the CPU the run goes on and writes no snapshot.
TEST(RlTrainer, TorchMemoryToolChoosesStepsAndRanksAsVerlAndRunsOnTheCpu) {
  hybridflow::testing::TempDir dir;
  const std::vector<std::string> memory = {"global_profiler.tool=torch_memory", "global_profiler.save_path=" + dir.path(),
                                           "global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries=500",
                                           "global_profiler.global_tool_config.torch_memory.stack_depth=32",
                                           "global_profiler.global_tool_config.torch_memory.stacks=cpp"};
  const ProfilerRunSpec every = rl_run_spec(load_rl_config("", tiny_rl_overrides("grpo", memory))).profiler;
  EXPECT_TRUE(every.on);
  EXPECT_EQ(every.tool, "torch_memory");
  EXPECT_TRUE(every.profiles(1) && every.profiles(7));
  EXPECT_TRUE(every.actor.enable && every.actor.all_ranks);
  EXPECT_FALSE(every.critic.enable);
  EXPECT_EQ(every.memory.max_entries, 500);
  EXPECT_EQ(every.memory.stacks, "cpp");
  std::vector<std::string> narrowed = memory;
  narrowed.insert(narrowed.end(), {"global_profiler.steps=[2]", "critic.profiler.enable=true", "critic.profiler.ranks=[0]"});
  const ProfilerRunSpec some = rl_run_spec(load_rl_config("", tiny_rl_overrides("gae", narrowed))).profiler;
  EXPECT_FALSE(some.profiles(1));
  EXPECT_TRUE(some.profiles(2));
  EXPECT_FALSE(some.actor.enable);
  EXPECT_TRUE(some.critic.enable);

  std::vector<std::string> run = memory;
  run.push_back("trainer.total_steps=2");
  RLTrainer trainer(load_rl_config("", tiny_rl_overrides("grpo", run)));
  trainer.fit();
  EXPECT_FALSE(std::filesystem::exists(dir.file("step_1/actor_rank0.memory.pickle")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("step_1/actor_rank0.summary.jsonl")));

  std::vector<std::string> bad = memory;
  bad.push_back("global_profiler.global_tool_config.torch_memory.context=everything");
  const std::string msg = error_of([&] { rl_run_spec(load_rl_config("", tiny_rl_overrides("grpo", bad))); });
  EXPECT_NE(msg.find("global_profiler.global_tool_config.torch_memory.context: expected alloc, state or all"),
            std::string::npos) << msg;
}

TEST(RlTrainer, TestFreqLogsTheHeldOutScoreOnThoseSteps) {
  RLTrainer trainer(load_rl_config("", tiny_rl_overrides("grpo", {"trainer.test_freq=2", "trainer.total_steps=4"})));
  const nlohmann::json first = trainer.step();
  const nlohmann::json second = trainer.step();
  EXPECT_FALSE(first.contains("val/score")) << first.dump();
  ASSERT_TRUE(second.contains("val/score")) << second.dump();
  // The same greedy evaluation the trainer runs before and after training, on the same prompts.
  EXPECT_DOUBLE_EQ(second.at("val/score").get<double>(), trainer.evaluate(4));
}

// The prompts a run trains on, in order, as a command scorer sees them (one line per response).
std::vector<std::string> prompts_seen(const std::string& dir, bool shuffle, int steps,
                                      const std::vector<std::string>& more = {}) {
  std::vector<Example> train;
  for (int i = 0; i < 8; ++i) train.push_back({std::to_string(i) + "+1=", std::to_string(i + 1)});
  write_examples_jsonl(dir + "/train.jsonl", train);
  const std::string log = dir + "/prompts.txt";
  const std::string scorer =
      "reward.shell=/usr/bin/python3 -c \"import sys,json\nfor l in sys.stdin:\n  open('" + log +
      "','a').write(json.loads(l)['prompt']+'\\n'); print(0.0, flush=True)\"";
  std::vector<std::string> overrides =
      tiny_rl_overrides("reinforce_plus_plus",
                        {"data.train_file=" + dir + "/train.jsonl", "actor_rollout_ref.rollout.n=1", "reward.type=command",
                         scorer, std::string("data.shuffle=") + (shuffle ? "true" : "false")});
  overrides.insert(overrides.end(), more.begin(), more.end());
  RLTrainer trainer(load_rl_config("", overrides));
  for (int i = 0; i < steps; ++i) trainer.step();
  std::vector<std::string> lines;
  std::ifstream in(log);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(RlTrainer, ShuffleVisitsEveryPromptOncePerPassInANewOrder) {
  hybridflow::testing::TempDir a, b;
  const auto in_order = prompts_seen(a.path(), false, 4);
  ASSERT_EQ(in_order.size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(in_order[static_cast<size_t>(i)], std::to_string(i) + "+1=");

  const auto shuffled = prompts_seen(b.path(), true, 8);  // two passes over the 8 prompts
  ASSERT_EQ(shuffled.size(), 16u);
  const std::vector<std::string> first(shuffled.begin(), shuffled.begin() + 8), second(shuffled.begin() + 8, shuffled.end());
  EXPECT_EQ(std::set<std::string>(first.begin(), first.end()), std::set<std::string>(in_order.begin(), in_order.end()));
  EXPECT_EQ(std::set<std::string>(second.begin(), second.end()), std::set<std::string>(in_order.begin(), in_order.end()));
  EXPECT_NE(first, in_order);
  EXPECT_NE(first, second);
}

// verl's data.seed: the prompts' order follows it and not trainer.seed; another data.seed, another order.
TEST(RlTrainer, DataSeedSetsThePromptOrder) {
  hybridflow::testing::TempDir a, b, c;
  const auto seven = prompts_seen(a.path(), true, 4, {"data.seed=7", "trainer.seed=1"});
  const auto seven_again = prompts_seen(b.path(), true, 4, {"data.seed=7", "trainer.seed=2"});
  const auto eight = prompts_seen(c.path(), true, 4, {"data.seed=8", "trainer.seed=1"});
  ASSERT_EQ(seven.size(), 8u);
  EXPECT_EQ(seven, seven_again);
  EXPECT_NE(seven, eight);
  EXPECT_EQ(std::set<std::string>(seven.begin(), seven.end()), std::set<std::string>(eight.begin(), eight.end()));
  EXPECT_NE(error_of([] { rl_run_spec(load_rl_config("", tiny_rl_overrides("grpo", {"data.seed=-1"}))); })
                .find("data.seed must be >= 0"),
            std::string::npos);
}

// data.train_max_samples: a seeded subset of the file's rows with shuffling (the same each pass), its first
// rows without; trainer.total_epochs counts the subset.
TEST(RlTrainer, TrainMaxSamplesTrainsOnThatManyPrompts) {
  hybridflow::testing::TempDir a, b;
  const auto first = prompts_seen(a.path(), false, 2, {"data.train_max_samples=3"});
  EXPECT_EQ(first, (std::vector<std::string>{"0+1=", "1+1=", "2+1=", "0+1="}));

  const auto subset = prompts_seen(b.path(), true, 6, {"data.train_max_samples=4"});  // three passes over 4
  ASSERT_EQ(subset.size(), 12u);
  const std::set<std::string> pass(subset.begin(), subset.begin() + 4);
  EXPECT_EQ(pass.size(), 4u);
  for (int p = 1; p < 3; ++p)
    EXPECT_EQ(std::set<std::string>(subset.begin() + 4 * p, subset.begin() + 4 * (p + 1)), pass) << "pass " << p;
  EXPECT_NE(pass, (std::set<std::string>{"0+1=", "1+1=", "2+1=", "3+1="})) << "a random subset, not the first rows";

  std::vector<std::string> by_epochs = tiny_rl_overrides(
      "grpo", {"data.train_file=" + b.path() + "/train.jsonl", "data.train_max_samples=4", "trainer.total_epochs=3"});
  std::erase(by_epochs, "trainer.total_steps=2");  // so that total_epochs decides
  const RunSpec spec = rl_run_spec(load_rl_config("", by_epochs));
  EXPECT_EQ(spec.trainer.total_steps, 6) << "3 epochs of 4 prompts, 2 a step";
  EXPECT_NE(error_of([] { rl_run_spec(load_rl_config("", tiny_rl_overrides("grpo", {"data.train_max_samples=0"}))); })
                .find("data.train_max_samples must be -1"),
            std::string::npos);
}

// verl's data.val_max_samples is the number of held-out prompts scored (data.test_size); both set differently is
// an error that names both.
TEST(RlTrainer, ValMaxSamplesIsTheNumberOfHeldOutPromptsScored) {
  hybridflow::testing::TempDir dir;
  std::vector<std::string> o = tiny_rl_overrides(
      "grpo", {"data.val_max_samples=3", "trainer.validation_data_dir=" + dir.path(), "trainer.total_steps=1"});
  std::erase(o, "data.test_size=4");
  RLTrainer trainer(load_rl_config("", o));
  EXPECT_EQ(trainer.spec().data.test_size, 3);
  trainer.evaluate(trainer.spec().data.test_size);
  EXPECT_EQ(read_jsonl(dir.path() + "/0.jsonl").size(), 3u);
  const std::string both =
      error_of([] { rl_run_spec(load_rl_config("", tiny_rl_overrides("grpo", {"data.val_max_samples=3"}))); });
  EXPECT_NE(both.find("data.val_max_samples (3) and data.test_size (4)"), std::string::npos) << both;
}

// trainer.critic_warmup: PPO's first steps train the critic alone; the actor's schedule starts at its first
// update. Without a critic the key is an error that names it.
TEST(RlTrainer, CriticWarmupLeavesTheActorAloneAtFirst) {
  RLTrainer trainer(load_rl_config(
      "", tiny_rl_overrides("gae", {"trainer.critic_warmup=1", "actor_rollout_ref.actor.optim.lr_warmup_steps=2",
                                    "trainer.total_steps=3"})));
  const double actor = trainer.parameter_sq_norm("actor"), critic = trainer.parameter_sq_norm("critic");
  const nlohmann::json first = trainer.step();
  EXPECT_EQ(trainer.parameter_sq_norm("actor"), actor);
  EXPECT_NE(trainer.parameter_sq_norm("critic"), critic);
  EXPECT_FALSE(first.contains("actor/pg_loss")) << first.dump();
  EXPECT_TRUE(first.contains("critic/vf_loss")) << first.dump();
  // Warm-up of 2: the actor's learning rate is 0 at its first update and half at its second.
  const nlohmann::json second = trainer.step();
  EXPECT_NEAR(second.at("actor/lr").get<double>(), 0.0, 1e-12) << second.dump();
  EXPECT_TRUE(second.contains("actor/pg_loss")) << second.dump();
  const nlohmann::json third = trainer.step();
  EXPECT_NEAR(third.at("actor/lr").get<double>(), 0.5e-3, 1e-12) << third.dump();
  EXPECT_NE(trainer.parameter_sq_norm("actor"), actor);

  const std::string error =
      error_of([] { RLTrainer t(load_rl_config("", tiny_rl_overrides("grpo", {"trainer.critic_warmup=2"}))); });
  EXPECT_NE(error.find("trainer.critic_warmup is 2 but the run has no critic"), std::string::npos) << error;
}

TEST(RlTrainer, ConfigErrorsNameTheKey) {
  try {
    RLTrainer trainer(load_rl_config("", tiny_rl_overrides("no_such_estimator")));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no_such_estimator"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_rl_config("", {"actor_rollout_ref.actor.ppo_mini_batch_sise=2"}), Error);
}

// A reward the random policy rarely earns (the response starts with '1', about 1 in 20 tokens) given by
// an external command: GRPO must make it the common case within a few steps.
TEST(RlTrainer, GrpoRaisesARareRewardFromAnExternalScorer) {
  const std::string scorer =
      "reward.shell=/usr/bin/python3 -c \"import sys,json; [print(1.0 if json.loads(l)['response'].startswith('1') "
      "else 0.0, flush=True) for l in sys.stdin]\"";
  RLTrainer trainer(load_rl_config(
      "", tiny_rl_overrides("grpo", {"reward.type=command", scorer, "data.train_batch_size=4",
                                     "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.rollout.response_length=2",
                                     "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                                     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
                                     "actor_rollout_ref.actor.optim.lr=3e-2", "actor_rollout_ref.actor.ppo_epochs=2",
                                     "trainer.total_steps=12"})));
  std::vector<double> scores;
  for (int i = 0; i < 12; ++i) scores.push_back(trainer.step().at("score/mean").get<double>());
  const double first = (scores[0] + scores[1]) / 2, last = (scores[10] + scores[11]) / 2;
  EXPECT_GT(last, first + 0.3) << "scores per step: " << ::testing::PrintToString(scores);
}

TEST(RlTrainer, SavesTheActorAsAModelDirectoryAndItsOptimizerState) {
  hybridflow::testing::TempDir dir;
  RLTrainer trainer(load_rl_config(
      "", tiny_rl_overrides("grpo", {"trainer.run_dir=" + dir.path(), "trainer.save_checkpoint=true",
                                     "trainer.total_steps=1"})));
  trainer.fit();
  for (const char* file : {"/checkpoints/step_1/actor/config.json", "/checkpoints/step_1/actor/model.safetensors",
                           "/checkpoints/step_1/actor/tokenizer.json", "/checkpoints/step_1/actor_optim.safetensors",
                           "/checkpoints/latest", "/metrics.jsonl"})
    EXPECT_TRUE(file_exists(dir.path() + file)) << file;
}

// Two runs on one run_dir would race on checkpoints and metrics: the second stops at start, naming the first.
TEST(RlTrainer, SecondRunOnTheSameRunDirFailsNamingTheHolder) {
  hybridflow::testing::TempDir dir;
  RLTrainer first(load_rl_config("", tiny_rl_overrides("grpo", {"trainer.run_dir=" + dir.path()})));
  try {
    RLTrainer second(load_rl_config("", tiny_rl_overrides("grpo", {"trainer.run_dir=" + dir.path()})));
    ADD_FAILURE() << "a second run on " << dir.path() << " must not start";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is in use by another hybridflow run (pid"), std::string::npos) << e.what();
  }
  first.fit();
  EXPECT_EQ(first.steps_done(), 2);  // the first run is unaffected
}

// verl's schedule steps once per RL step: with two mini-batches per step (two optimizer steps) and a
// 2-step warm-up from 0, the actor's rate is 0, lr/2, lr over the first three steps.
TEST(RlTrainer, LearningRateFollowsVerlsScheduleOncePerRlStep) {
  const double lr = 1e-3;
  RLTrainer warmup(load_rl_config(
      "", tiny_rl_overrides("grpo", {"actor_rollout_ref.actor.ppo_mini_batch_size=1",
                                     "actor_rollout_ref.actor.optim.lr_warmup_steps=2", "trainer.total_steps=3"})));
  for (double expected : {0.0, lr / 2, lr}) {
    const nlohmann::json record = warmup.step();
    EXPECT_NEAR(record.at("actor/lr").get<double>(), expected, 1e-12) << record.dump();
  }
  // Cosine from lr to min_lr_ratio x lr over trainer.total_steps = 4, the warm-up taken as a ratio (0.25 x 4 = 1).
  RLTrainer cosine(load_rl_config(
      "", tiny_rl_overrides("grpo", {"actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",
                                     "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.25",
                                     "actor_rollout_ref.actor.optim.min_lr_ratio=0.5", "trainer.total_steps=4"})));
  const double at_step[] = {0.0, lr, lr * (0.5 + 0.5 * 0.5 * (1 + std::cos(M_PI / 3))),
                            lr * (0.5 + 0.5 * 0.5 * (1 + std::cos(2 * M_PI / 3)))};
  for (double expected : at_step) {
    const nlohmann::json record = cosine.step();
    EXPECT_NEAR(record.at("actor/lr").get<double>(), expected, 1e-12) << record.dump();
  }
  // verl's num_cycles = 1: down to the floor halfway through the decay and back up to lr at its end.
  RLTrainer cycle(load_rl_config(
      "", tiny_rl_overrides("grpo", {"actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",
                                     "actor_rollout_ref.actor.optim.num_cycles=1", "trainer.total_steps=4"})));
  for (double expected : {lr, lr / 2, 0.0, lr / 2}) {
    const nlohmann::json record = cycle.step();
    EXPECT_NEAR(record.at("actor/lr").get<double>(), expected, 1e-12) << record.dump();
  }
  const std::string bad = error_of([] {
    RLTrainer t(load_rl_config("", tiny_rl_overrides("grpo", {"actor_rollout_ref.actor.optim.lr_scheduler_type=linear"})));
  });
  EXPECT_NE(bad.find("actor_rollout_ref.actor.optim.lr_scheduler_type: expected constant | cosine"), std::string::npos)
      << bad;
  // Megatron's name for the key (verl's ppo_megatron_trainer.yaml) reaches the same check.
  const std::string wsd = error_of([] {
    RLTrainer t(load_rl_config("", tiny_rl_overrides("grpo", {"actor_rollout_ref.actor.optim.lr_decay_style=WSD"})));
  });
  EXPECT_NE(wsd.find("lr_scheduler_type: expected constant | cosine (verl's), got 'WSD'"), std::string::npos) << wsd;
}

// The rollout's KV cache is a memory layout, not a policy: a GRPO run on the paged cache and one on the
// slot cache train the same numbers, and the paged run reports its cache's peak each step.
TEST(RlTrainer, PagedAndSlotKvCachesTrainTheSameRun) {
  auto run = [](const std::string& kv_cache) {
    hybridflow::testing::TempDir dir;
    RLTrainer trainer(load_rl_config(
        "", tiny_rl_overrides("grpo", {"trainer.run_dir=" + dir.path(), "actor_rollout_ref.rollout.kv_cache=" + kv_cache,
                                       "actor_rollout_ref.rollout.kv_block_size=4"})));
    trainer.fit();
    return read_jsonl(dir.path() + "/metrics.jsonl");
  };
  const auto paged = run("paged"), slots = run("slots");
  ASSERT_EQ(paged.size(), slots.size());
  for (size_t i = 0; i < paged.size(); ++i) {
    for (const char* key : {"score/mean", "actor/pg_loss", "actor/entropy", "response_length/mean", "actor/grad_norm"}) {
      if (!paged[i].contains(key)) continue;
      EXPECT_EQ(paged[i].at(key), slots[i].at(key)) << key << " at step " << i + 1;
    }
    EXPECT_GT(paged[i].at("memory/rollout_kv_cache_peak_bytes").get<double>(), 0.0);
  }
  EXPECT_NE(error_of([] { RLTrainer t(load_rl_config("", tiny_rl_overrides("grpo", {"actor_rollout_ref.rollout.kv_cache=pages"}))); })
                .find("actor_rollout_ref.rollout.kv_cache"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              RLTrainer t(load_rl_config("", tiny_rl_overrides("grpo", {"actor_rollout_ref.rollout.gpu_memory_utilization=1.5"})));
            }).find("actor_rollout_ref.rollout.gpu_memory_utilization"),
            std::string::npos);
}

// verl's PF-PPO (algorithm.use_pf_ppo): the updates train on the batch resampled by score. With max_min every
// drawn row holds the step's highest or lowest score, so the drawn rows' mean is (k max + (B - k) min) / B for a
// whole k, and no more distinct rows are drawn than hold those scores; the same seed draws the same rows.
TEST(RlTrainer, PfPpoTrainsOnRowsDrawnByScore) {
  auto run = [](const std::string& run_dir) {
    std::vector<std::string> o = tiny_rl_overrides(
        "gae", {"data.train_batch_size=4", "algorithm.use_pf_ppo=true", "algorithm.pf_ppo.reweight_method=max_min",
                "trainer.rollout_data_dir=" + run_dir + "/rollouts"});
    hybridflow::testing::append_digit_reward_run(o, 2, run_dir, {});
    RLTrainer trainer(load_rl_config("", o));
    trainer.fit();
    return read_jsonl(run_dir + "/metrics.jsonl");
  };
  hybridflow::testing::TempDir dir;
  const auto metrics = run(dir.path() + "/a");
  ASSERT_EQ(metrics.size(), 2u);
  for (size_t step = 0; step < metrics.size(); ++step) {
    const auto& m = metrics[step];
    const auto rows = read_jsonl(dir.path() + "/a/rollouts/" + std::to_string(step + 1) + ".jsonl");
    ASSERT_EQ(rows.size(), 8u);
    std::vector<double> scores;
    for (const auto& r : rows) scores.push_back(r.at("score").get<double>());
    const double hi = *std::max_element(scores.begin(), scores.end());
    const double lo = *std::min_element(scores.begin(), scores.end());
    const auto extremes = std::count_if(scores.begin(), scores.end(), [&](double s) { return s == hi || s == lo; });
    const double drawn_mean = m.at("pf_ppo/score_mean").get<double>();
    bool whole_k = false;
    for (int k = 0; k <= 8; ++k) whole_k = whole_k || std::abs(drawn_mean - (k * hi + (8 - k) * lo) / 8) < 1e-9;
    EXPECT_TRUE(whole_k) << "drawn mean " << drawn_mean << " from scores in [" << lo << ", " << hi << "]";
    EXPECT_GE(m.at("pf_ppo/distinct_rows").get<double>(), 1.0);
    EXPECT_LE(m.at("pf_ppo/distinct_rows").get<double>(), static_cast<double>(extremes)) << m.dump();
    EXPECT_TRUE(m.contains("critic/vf_loss") && m.contains("actor/pg_loss")) << m.dump();
  }
  const auto again = run(dir.path() + "/b");
  for (size_t step = 0; step < metrics.size(); ++step)
    for (const char* key : {"pf_ppo/score_mean", "pf_ppo/distinct_rows", "actor/pg_loss"})
      EXPECT_EQ(metrics[step].at(key), again[step].at(key)) << key << " at step " << step + 1;

  const std::string grpo = error_of(
      [] { RLTrainer t(load_rl_config("", tiny_rl_overrides("grpo", {"algorithm.use_pf_ppo=true"}))); });
  EXPECT_NE(grpo.find("algorithm.use_pf_ppo resamples PPO's batch: it needs algorithm.adv_estimator gae"),
            std::string::npos)
      << grpo;
  const std::string method = error_of([] {
    RLTrainer t(load_rl_config("", tiny_rl_overrides("gae", {"algorithm.pf_ppo.reweight_method=softmax"})));
  });
  EXPECT_NE(method.find("algorithm.pf_ppo.reweight_method: expected pow | max_min | max_random"), std::string::npos)
      << method;
}

// verl's rollout.ignore_eos: the tiny model stops some responses early (eos), ignoring eos none of them.
TEST(RlTrainer, IgnoreEosRunsEveryResponseToItsLength) {
  hybridflow::testing::TempDir dir;
  auto run = [&](const std::string& ignore_eos) {
    const std::string run_dir = dir.path() + "/" + ignore_eos;
    RLTrainer trainer(load_rl_config(
        "", tiny_rl_overrides("grpo", {"trainer.run_dir=" + run_dir, "trainer.total_steps=3",
                                       "actor_rollout_ref.rollout.response_length=6",
                                       "actor_rollout_ref.rollout.ignore_eos=" + ignore_eos})));
    trainer.fit();
    return read_jsonl(run_dir + "/metrics.jsonl");
  };
  double shortest_stopping = 6;
  for (const auto& m : run("false")) shortest_stopping = std::min(shortest_stopping, m.at("response_length/min").get<double>());
  EXPECT_LT(shortest_stopping, 6) << "the control run never drew eos: nothing to ignore";
  for (const auto& m : run("true")) {
    EXPECT_EQ(m.at("response_length/min").get<double>(), 6) << m.dump();
    EXPECT_EQ(m.at("response_length/clip_ratio").get<double>(), 1.0) << m.dump();
  }
}

// DAPO's overlong buffer as verl's DAPO reward manager takes it (reward_model.reward_kwargs): every response runs
// to 6 tokens, so the penalty is -(6 - (max_resp_len - len)) / len x penalty_factor: -0.5 by the response budget
// (expected length 6 - 2), -1.25 with max_resp_len 3 (expected length 1).
TEST(RlTrainer, OverlongBufferFromVerlsRewardKwargsEndsAtMaxRespLen) {
  auto penalty = [](std::vector<std::string> more) {
    more.insert(more.end(), {"actor_rollout_ref.rollout.response_length=6", "actor_rollout_ref.rollout.ignore_eos=true",
                             "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
                             "+reward_model.reward_kwargs.overlong_buffer_cfg.len=2",
                             "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
                             "+reward_model.reward_kwargs.overlong_buffer_cfg.log=True", "trainer.total_steps=1",
                             "trainer.log_samples_freq=0", "trainer.test_freq=0"});
    RLTrainer trainer(load_rl_config("", tiny_rl_overrides("grpo", more)));
    return trainer.step().at("score/overlong_penalty_mean").get<double>();
  };
  EXPECT_DOUBLE_EQ(penalty({}), -0.5);
  EXPECT_DOUBLE_EQ(penalty({"+reward_model.reward_kwargs.max_resp_len=3"}), -1.25);
  const std::string error = hybridflow::testing::error_of([&] { penalty({"reward_model.overlong_buffer.max_resp_len=1"}); });
  EXPECT_NE(error.find("reward_model.overlong_buffer.len must be in (0, 1] (reward_model.overlong_buffer.max_resp_len)"),
            std::string::npos)
      << error;
}

// train --check sizes the model the workers build: a preset with the config's dimensions over it.
TEST(RlTrainer, CheckSizesThePresetWithTheConfigsDimensions) {
  auto parameters = [](const std::vector<std::string>& extra) {
    return RLTrainer::check(load_rl_config("", tiny_rl_overrides("grpo", extra))).at("parameters").get<double>();
  };
  const double narrow = parameters({});  // hidden size 32 over the preset
  const double wide = parameters({"model.hidden_size=64"});
  const double deeper = parameters({"model.num_hidden_layers=2"});
  EXPECT_GT(wide, narrow);
  EXPECT_GT(deeper, narrow);
  EXPECT_NE(wide, deeper);
}
