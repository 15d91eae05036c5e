// `hybridflow plan`: the printed plan and its JSON, the config fragment it writes (loaded by the trainer's
// config loader, and run by `hybridflow train` on this machine), calibration, and clear errors.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "hybridflow/placement/calibration.h"
#include "hybridflow/placement/placement_spec.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace {

using hybridflow::testing::CommandResult;
using hybridflow::testing::run_hybridflow;

nlohmann::json last_json_line(const std::string& output) {
  const auto start = output.rfind("\n{");
  return nlohmann::json::parse(start == std::string::npos ? output : output.substr(start + 1));
}

// A calibration with round figures, so that planning for this machine needs no measuring.
std::string write_calibration(const hybridflow::testing::TempDir& dir) {
  hybridflow::placement::Calibration c;
  c.created = "2025-01-01T00:00:00Z";
  c.host = "test";
  c.cores = 2;
  c.memory_bytes = 8e9;
  c.matmul_flops = 50e9;
  c.memory_bandwidth = 10e9;
  c.allreduce_bandwidth = 2e9;
  c.allreduce_latency_s = 50e-6;
  c.compute_efficiency = 0.5;
  c.overheads = {0.005, 1e-3, 1e-4, 3e-4, 0.02};
  hybridflow::placement::CalibrationCheck check;
  check.placement = "split";
  check.layout = "{actor,rollout,ref}x1 {critic}x1";
  check.use = "check";
  check.measured_s = 0.4;
  check.predicted_s = 0.42;
  c.checks.push_back(check);
  const std::string path = dir.file("calibration.json");
  hybridflow::placement::save_calibration(path, c);
  return path;
}

}  // namespace

TEST(CliPlan, PrintsThePlanItsStagesAndTheRunnersUp) {
  CommandResult r = run_hybridflow("plan --gpus 16 --model llama-7b");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* part : {"searched 52 placements", "placement: ", "pool 0", "iteration ", "tokens/s",
                           "busy seconds by stage", "actor.update_actor", "actor.generate_sequences", "runners-up",
                           "memory per device"})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
}

TEST(CliPlan, PredictsTheAsyncSpeedupByStaleness) {
  CommandResult r = run_hybridflow("plan --gpus 16 --model llama-7b --staleness 3 --sync-every 2 --runners-up 100");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* part : {"async speed-up (simulated)", "sync every", "<- --staleness"})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
  CommandResult j = run_hybridflow("plan --gpus 16 --model llama-7b --staleness 3 --sync-every 2 --runners-up 100 --json");
  ASSERT_EQ(j.exit_code, 0) << j.output;
  const nlohmann::json points = last_json_line(j.output).at("async").at("by_staleness");
  ASSERT_EQ(points.size(), 5u);  // 0, 1, 2, 3 (asked), 4
  std::vector<int> ks;
  for (const auto& p : points) ks.push_back(p.at("staleness").get<int>());
  EXPECT_EQ(ks, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_DOUBLE_EQ(points[0].at("speedup").get<double>(), 1.0);
  EXPECT_EQ(points[3].at("sync_every").get<int>(), 2);
  EXPECT_EQ(points[1].at("sync_every").get<int>(), 2);  // min(N, k + 1)
  EXPECT_EQ(points[0].at("sync_every").get<int>(), 1);
  for (size_t i = 1; i < points.size(); ++i) EXPECT_GT(points[i].at("speedup").get<double>(), 1.0) << i;
}

TEST(CliPlan, JsonDescribesACompletePlan) {
  CommandResult r = run_hybridflow("plan --gpus 32 --model llama-13b --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = last_json_line(r.output);
  ASSERT_TRUE(j.at("found").get<bool>());
  EXPECT_GT(j.at("search").at("seconds").get<double>(), 0.0);
  EXPECT_EQ(j.at("search").at("placements").get<int>(), 52);
  const nlohmann::json& best = j.at("best");
  int devices = 0;
  std::multiset<std::string> roles;
  for (const auto& set : best.at("sets")) {
    devices += set.at("devices").get<int>();
    for (const auto& role : set.at("roles")) {
      roles.insert(role.at("role").get<std::string>());
      EXPECT_EQ(role.at("pp").get<int>() * role.at("tp").get<int>() * role.at("dp").get<int>(), set.at("devices").get<int>());
    }
    EXPECT_LE(set.at("memory").at("peak_bytes").get<double>(), set.at("memory").at("usable_bytes").get<double>());
  }
  EXPECT_EQ(devices, 32);
  EXPECT_EQ(roles, (std::multiset<std::string>{"actor", "rollout", "ref", "critic", "reward_model"}));
  const double t = best.at("iteration_s").get<double>();
  EXPECT_GT(t, 0.0);
  EXPECT_NEAR(best.at("tokens_per_s").get<double>(), 1024.0 * 2048 / t, 1e-6 * 1024 * 2048 / t);
  EXPECT_FALSE(best.at("calls").empty());
  for (const auto& other : j.at("runners_up")) EXPECT_GE(other.at("iteration_s").get<double>(), t);
}

TEST(CliPlan, TheWrittenFragmentLoadsThroughTheTrainersConfig) {
  hybridflow::testing::TempDir dir;
  const std::string fragment = dir.file("plan.yaml");
  CommandResult r = run_hybridflow("plan --gpus 16 --model llama-7b --json --write-config " + fragment);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = last_json_line(r.output);
  const nlohmann::json& plan = j.contains("best_runnable_today") ? j.at("best_runnable_today") : j.at("best");
  ASSERT_TRUE(plan.at("trainer").at("runnable_today").get<bool>());
  const hybridflow::Config config = hybridflow::load_rl_config(fragment, {});
  // The trainer's own reading of the placement (a preset or a pools: section) gives the plan's pools.
  const hybridflow::RolePlacement placement = hybridflow::resolve_placement(config, {"actor", "critic", "reward_model"});
  EXPECT_EQ(placement.pools.size(), plan.at("sets").size());
  if (plan.at("sets").size() == 1) {
    EXPECT_EQ(placement.kind, "colocate");
  }
  for (const auto& set : plan.at("sets"))
    for (const auto& role : set.at("roles")) {
      const std::string name = role.at("role").get<std::string>();
      if (name != "ref" && (name != "rollout" || placement.standalone_rollout())) {
        EXPECT_EQ(placement.pool_of(name).processes, set.at("devices").get<int>()) << name;
      }
      if (name == "actor") {
        EXPECT_EQ(config.get<int>("actor_rollout_ref.actor.megatron.tensor_model_parallel_size"), role.at("tp").get<int>());
        EXPECT_EQ(config.get<int>("actor_rollout_ref.actor.megatron.pipeline_model_parallel_size"), role.at("pp").get<int>());
      } else if (name == "rollout") {
        EXPECT_EQ(config.get<int>("actor_rollout_ref.rollout.tensor_model_parallel_size"), role.at("tp").get<int>());
      } else if (name == "critic") {
        EXPECT_EQ(config.get<int>("critic.megatron.tensor_model_parallel_size"), role.at("tp").get<int>());
      }
    }
  EXPECT_EQ(config.get<int64_t>("data.train_batch_size"), 1024);
  EXPECT_EQ(config.get<std::string>("actor_rollout_ref.actor.dtype"), "bf16");
}

TEST(CliPlan, APlanForThisMachineRunsInHybridflowTrain) {
  hybridflow::testing::TempDir dir;
  const std::string calibration = write_calibration(dir);
  CommandResult init = run_hybridflow("init --preset tiny --task addition --out " + dir.file("m"));
  ASSERT_EQ(init.exit_code, 0) << init.output;
  const std::string fragment = dir.file("plan.yaml");
  CommandResult r = run_hybridflow("plan --gpu this-machine --gpus 2 --calibration " + calibration + " --model " +
                                   dir.file("m") + " --batch 4 --prompt-length 16 --response-length 4 --reward-model off "
                                   "--micro-batch 2 --forward-micro-batch 2 --write-config " + fragment);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("last measured prediction error"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("measured 0.400 s/step, predicted 0.420 s (+5.0%)"), std::string::npos) << r.output;
  CommandResult train = run_hybridflow("train --config " + fragment + " model.path=" + dir.file("m") +
                                       " data.task=addition data.train_size=16 data.test_size=4 trainer.total_steps=1"
                                       " algorithm.adv_estimator=gae trainer.run_dir=" + dir.file("run"));
  EXPECT_EQ(train.exit_code, 0) << train.output;
}

TEST(CliPlan, CalibrateWritesConstantsAndChecks) {
  hybridflow::testing::TempDir dir;
  const std::string path = dir.file("cal.json");
  CommandResult r = run_hybridflow("plan --calibrate --calibrate-quick --calibrate-steps 2 --calibration " + path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const hybridflow::placement::Calibration c = hybridflow::placement::load_calibration(path);
  EXPECT_GT(c.matmul_flops, 0.0);
  EXPECT_GT(c.memory_bandwidth, 0.0);
  EXPECT_GT(c.allreduce_bandwidth, 0.0);
  EXPECT_GT(c.compute_efficiency, 0.0);
  EXPECT_LE(c.compute_efficiency, 1.0);
  int checks = 0, asyncs = 0;
  for (const auto& k : c.checks) {
    EXPECT_GT(k.measured_s, 0.0);
    EXPECT_GT(k.predicted_s, 0.0);
    checks += k.use == "check";
    asyncs += k.use == "async";
  }
  EXPECT_EQ(checks, 3);  // on two processes: colocated, split and a standalone rollout
  EXPECT_EQ(asyncs, 2);  // a standalone rollout at staleness 0 and 2
  ASSERT_EQ(hybridflow::placement::async_speedups(c).size(), 1u);
  EXPECT_NE(r.output.find("async speed-up, staleness 2 over 0"), std::string::npos) << r.output;
  CommandResult init = run_hybridflow("init --preset tiny --task addition --out " + dir.file("m"));
  ASSERT_EQ(init.exit_code, 0) << init.output;
  CommandResult plan = run_hybridflow("plan --gpu this-machine --gpus 2 --model " + dir.file("m") +
                                      " --batch 8 --prompt-length 8 --response-length 8 --calibration " + path);
  EXPECT_EQ(plan.exit_code, 0) << plan.output;
  EXPECT_NE(plan.output.find("last measured prediction error"), std::string::npos) << plan.output;
  EXPECT_NE(plan.output.find("async speed-up, staleness 2 over 0"), std::string::npos) << plan.output;
}

TEST(CliPlan, WithoutAReferenceNoPlanPlacesOne) {
  CommandResult r = run_hybridflow("plan --gpus 8 --model qwen2.5-0.5b --algorithm grpo --batch 64 --n 4 "
                                   "--prompt-length 256 --response-length 256 --reference off --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = last_json_line(r.output);
  EXPECT_FALSE(j.at("workload").at("reference").get<bool>());
  EXPECT_EQ(j.at("search").at("placements").get<int>(), 2);  // {actor,rollout} together or apart
  std::vector<nlohmann::json> plans = {j.at("best")};
  for (const auto& other : j.at("runners_up")) plans.push_back(other);
  for (const auto& plan : plans) {
    for (const auto& set : plan.at("sets"))
      for (const auto& role : set.at("roles")) EXPECT_NE(role.at("role").get<std::string>(), "ref");
    for (const auto& call : plan.at("calls")) EXPECT_NE(call.at("call").get<std::string>(), "actor.compute_ref_log_prob");
  }
  CommandResult with = run_hybridflow("plan --gpus 8 --model qwen2.5-0.5b --algorithm grpo --batch 64 --n 4 "
                                      "--prompt-length 256 --response-length 256 --json");
  ASSERT_EQ(with.exit_code, 0) << with.output;
  const nlohmann::json w = last_json_line(with.output);
  EXPECT_TRUE(w.at("workload").at("reference").get<bool>());  // on unless asked: today's plans are unchanged
  EXPECT_EQ(w.at("search").at("placements").get<int>(), 5);
  EXPECT_LE(j.at("best").at("iteration_s").get<double>(), w.at("best").at("iteration_s").get<double>());
  CommandResult text = run_hybridflow("plan --gpus 8 --model qwen2.5-0.5b --algorithm grpo --reference off");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find(", no reference model"), std::string::npos) << text.output;
}

TEST(CliPlan, BadInputIsNamed) {
  CommandResult gpu = run_hybridflow("plan --gpus 16 --gpu v100");
  EXPECT_EQ(gpu.exit_code, 1);
  EXPECT_NE(gpu.output.find("a100-80g"), std::string::npos) << gpu.output;
  CommandResult missing = run_hybridflow("plan --gpus 2 --gpu this-machine --calibration /nonexistent/cal.json");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find("--calibrate"), std::string::npos) << missing.output;
  CommandResult model = run_hybridflow("plan --gpus 16 --model gpt-5");
  EXPECT_EQ(model.exit_code, 1);
  EXPECT_NE(model.output.find("llama-7b"), std::string::npos) << model.output;
  CommandResult sync = run_hybridflow("plan --gpus 16 --staleness 1 --sync-every 3");
  EXPECT_EQ(sync.exit_code, 1);
  EXPECT_NE(sync.output.find("staleness + 1"), std::string::npos) << sync.output;
  CommandResult reference = run_hybridflow("plan --gpus 16 --reference no");
  EXPECT_EQ(reference.exit_code, 1);
  EXPECT_NE(reference.output.find("--reference must be on or off, got 'no'"), std::string::npos) << reference.output;
  CommandResult too_big = run_hybridflow("plan --gpus 2 --model llama-70b");
  EXPECT_EQ(too_big.exit_code, 1);
  EXPECT_NE(too_big.output.find("no plan fits"), std::string::npos) << too_big.output;
}
