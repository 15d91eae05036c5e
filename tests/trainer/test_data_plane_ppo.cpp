// PPO with the actor (2 processes), the critic and the reward model each in a pool of its own
// (trainer.colocate: false). With the data plane (the default) the rollout's bulk tensors go from the
// actor's workers to the critic's and the reward model's directly, and tensors the controller fetched go
// back to the workers as references, so the controller moves fewer bytes per step; the metrics and the
// weights are those of the run without it (HF_DATA_PLANE=0), bit for bit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>

#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/deterministic_metrics.h"
#include "support/temp_dir.h"
#include "trainer/parallel_ppo_fixture.h"

using namespace hybridflow;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

namespace {

struct PpoRun {
  std::vector<nlohmann::json> records;
  std::vector<double> sq_norms;
};

PpoRun run_ppo(bool data_plane, const std::string& rm_dir) {
  ::setenv("HF_DATA_PLANE", data_plane ? "1" : "0", 1);  // read when the trainer builds its pools
  RLTrainer trainer(load_rl_config(
      "", hybridflow::testing::tiny_rl_overrides(
              "gae", {"trainer.colocate=false", "actor_rollout_ref.num_processes=2",
                      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "critic.ppo_micro_batch_size_per_gpu=1",
                      "actor_rollout_ref.actor.use_kl_loss=true", "reward_model.enable=true",
                      "reward_model.path=" + rm_dir})));
  ::unsetenv("HF_DATA_PLANE");
  PpoRun run;
  for (int i = 0; i < 2; ++i) run.records.push_back(trainer.step());
  for (const char* role : {"actor", "critic"}) run.sq_norms.push_back(trainer.parameter_sq_norm(role));
  return run;
}

// What must not depend on how the bytes travelled: everything but wall-clock figures, the byte counts and
// the processes' memory (resident sets differ with the sockets and buffers each path holds).
nlohmann::json deterministic_part(const nlohmann::json& record) {
  return hybridflow::testing::deterministic_metrics(record);
}

}  // namespace

TEST(DataPlanePpo, SameRunWithFewerBytesThroughTheController) {
  hybridflow::testing::TempDir dir;
  const std::string rm_dir = hybridflow::testing::write_reward_model(dir.path() + "/rm");
  const PpoRun through_controller = run_ppo(false, rm_dir);
  const PpoRun direct = run_ppo(true, rm_dir);
  ASSERT_EQ(direct.records.size(), through_controller.records.size());
  for (size_t i = 0; i < direct.records.size(); ++i) {
    EXPECT_EQ(deterministic_part(direct.records[i]), deterministic_part(through_controller.records[i])) << "step " << i + 1;
    const double before = through_controller.records[i].at("perf/controller_bytes").get<double>();
    const double after = direct.records[i].at("perf/controller_bytes").get<double>();
    std::cout << "step " << i + 1 << ": controller tensor bytes " << before << " -> " << after << " ("
              << after / before << "x), worker to worker "
              << direct.records[i].at("perf/worker_to_worker_bytes").get<double>() << "\n";
    EXPECT_LT(after, before / 2) << "step " << i + 1;
    EXPECT_EQ(through_controller.records[i].at("perf/worker_to_worker_bytes").get<double>(), 0.0);
    EXPECT_GT(direct.records[i].at("perf/worker_to_worker_bytes").get<double>(), 0.0);
  }
  EXPECT_EQ(direct.sq_norms, through_controller.sq_norms);
}
