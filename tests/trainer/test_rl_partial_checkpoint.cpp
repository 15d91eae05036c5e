// Partial rollouts in checkpoints over real worker processes: a checkpoint stops the generations in flight
// between two tokens and keeps their responses so far (rollout_partial.bin), and the run goes on from them.
// A run resumed from that checkpoint continues the same responses with the same weights, so it trains the
// same batches as the run that wrote it: metrics and weights bit for bit. A damaged or mismatched file
// stops the resume with an error naming it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "hybridflow/core/data_proto.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/jsonl.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/checkpoint.h"
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

// Staleness 1 with partial rollouts, weights to the rollout every second update. Step 4's rollout starts
// at step 3 on the weights of update 2, while step 3 trains; no sync comes at update 3, so it is still
// running at step 3's checkpoint when its prompts are many and their samples run one prompt at a time.
// The checkpoint stops it, and the pool takes update 3's weights to go on with it. The run's last step is
// 4, so nothing generated after the checkpoint depends on when a later sync arrives.
std::vector<std::string> partial_run(const std::string& run_dir, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> o = {"trainer.placement=standalone",
                                "actor_rollout_ref.rollout.staleness=1",
                                "actor_rollout_ref.rollout.trigger_parameter_sync_step=2",
                                "actor_rollout_ref.rollout.partial_rollout=true",
                                "actor_rollout_ref.rollout.response_length=64",
                                "actor_rollout_ref.rollout.max_num_seqs=2",
                                "data.train_size=64",
                                "data.train_batch_size=16",
                                "actor_rollout_ref.actor.ppo_mini_batch_size=16",
                                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
                                // The untrained model scores 0 on every prompt: the entropy bonus moves the weights.
                                "actor_rollout_ref.actor.entropy_coeff=0.01",
                                "actor_rollout_ref.actor.optim.lr=2e-2",
                                "trainer.total_steps=4",
                                "trainer.save_freq=3",
                                "trainer.run_dir=" + run_dir};
  o.insert(o.end(), extra.begin(), extra.end());
  return hybridflow::testing::tiny_rl_overrides("grpo", o);
}

struct Straight {
  std::vector<nlohmann::json> metrics;
  std::vector<double> sq_norms;  // actor, rollout
};

Straight run_to_end(RLTrainer& trainer, const std::string& run_dir) {
  trainer.fit();
  Straight end;
  for (const auto& record : read_jsonl(run_dir + "/metrics.jsonl"))
    end.metrics.push_back(hybridflow::testing::deterministic_metrics(record));
  for (const char* role : {"actor", "rollout"}) end.sq_norms.push_back(trainer.parameter_sq_norm(role));
  return end;
}

// The tokens a checkpoint holds of responses still in flight (-1: it holds no partial rollout).
int64_t partial_tokens(const std::string& checkpoint) {
  const std::string file = checkpoint + "/rollout_partial.bin";
  if (!fs::exists(file)) return -1;
  const DataProto request = DataProto::deserialize(read_file(file));
  return request.tensor("partial_lengths").sum().item<int64_t>();
}

// A straight run whose step-3 checkpoint caught the next rollout mid-response. Whether it does depends on
// the clock (the rollout may finish before the trainer pauses it), so a few runs are allowed.
struct CaughtRun {
  hybridflow::testing::TempDir dir;
  Straight end;
  std::string checkpoint;
};

std::unique_ptr<CaughtRun> straight_run_with_partials_at_checkpoint() {
  for (int attempt = 0; attempt < 4; ++attempt) {
    auto run = std::make_unique<CaughtRun>();
    RLTrainer trainer(load_rl_config("", partial_run(run->dir.path(), {"trainer.max_ckpt_to_keep=0"})));
    run->end = run_to_end(trainer, run->dir.path());
    run->checkpoint = checkpoints_root(run->dir.path()) + "/step_3";
    if (partial_tokens(run->checkpoint) > 0) return run;
  }
  return nullptr;
}

TEST(PartialRolloutCheckpoint, ResumedRunContinuesTheSavedResponsesAndTrainsWhatTheSavingRunTrained) {
  const auto straight = straight_run_with_partials_at_checkpoint();
  ASSERT_NE(straight, nullptr) << "no run's step-3 checkpoint caught step 4's rollout with tokens drawn";
  ASSERT_EQ(straight->end.metrics.size(), 4u);
  // The updates changed the policy, so continuing on other weights would change the samples.
  EXPECT_NE(straight->end.metrics[3].at("actor/entropy"), straight->end.metrics[0].at("actor/entropy"));
  // The saving run trained step 4 on responses that went on after the checkpoint: their prefix is saved.
  EXPECT_FALSE(fs::exists(straight->checkpoint + "/rollout_in_flight.bin"));
  EXPECT_TRUE(fs::exists(straight->checkpoint + "/rollout_in_flight_prompts.bin"));

  hybridflow::testing::TempDir resumed_dir;
  RLTrainer trainer(load_rl_config(
      "", partial_run(resumed_dir.path(),
                      {"trainer.resume_mode=resume_path", "trainer.resume_from_path=" + straight->checkpoint})));
  EXPECT_EQ(trainer.resumed_from(), straight->checkpoint);
  EXPECT_EQ(trainer.steps_done(), 3);
  const Straight resumed = run_to_end(trainer, resumed_dir.path());
  ASSERT_EQ(resumed.metrics.size(), 1u);
  EXPECT_EQ(resumed.metrics[0].at("step"), 4);
  // The staleness figures too: the saved tokens keep the versions that drew them (2), the rest are 3's.
  EXPECT_GT(resumed.metrics[0].at("rollout/stale_token_fraction").get<double>(), 0);
  EXPECT_EQ(resumed.metrics[0], straight->end.metrics[3]);
  EXPECT_EQ(resumed.sq_norms, straight->end.sq_norms);
}

TEST(PartialRolloutCheckpoint, ADamagedOrMismatchedPartialRolloutFileIsNamedInTheError) {
  const auto straight = straight_run_with_partials_at_checkpoint();
  ASSERT_NE(straight, nullptr) << "no run's step-3 checkpoint caught step 4's rollout with tokens drawn";
  const std::string file = straight->checkpoint + "/rollout_partial.bin";
  auto resume = [&](const std::vector<std::string>& extra) {
    hybridflow::testing::TempDir dir;
    std::vector<std::string> o = {"trainer.resume_mode=resume_path", "trainer.resume_from_path=" + straight->checkpoint};
    o.insert(o.end(), extra.begin(), extra.end());
    return hybridflow::testing::error_of([&] { RLTrainer trainer(load_rl_config("", partial_run(dir.path(), o))); });
  };
  // Another response length: the saved responses do not fit the run's.
  std::string error = resume({"actor_rollout_ref.rollout.response_length=48"});
  EXPECT_NE(error.find(file), std::string::npos) << error;
  EXPECT_NE(error.find("response_length = 48"), std::string::npos) << error;
  // Without partial rollouts nothing could continue them.
  error = resume({"actor_rollout_ref.rollout.partial_rollout=false"});
  EXPECT_NE(error.find(file), std::string::npos) << error;
  EXPECT_NE(error.find("partial_rollout: true"), std::string::npos) << error;
  // A damaged file: cut in half.
  const std::string bytes = read_file(file);
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  }
  error = resume({});
  EXPECT_NE(error.find(file), std::string::npos) << error;
  EXPECT_NE(error.find("damaged"), std::string::npos) << error;
}

}  // namespace
