// The same PPO run (actor, critic, a graded reward) under every placement, over real worker processes:
// colocate, split, standalone on-policy, standalone one-step off-policy and a pools: section of three
// pools. On-policy, where roles run does not change a single number: every placement writes colocate's
// metrics and ends with its weights, bit for bit. One-step off-policy learns as well within a tolerance.
// The timelines show what each placement overlaps: split's two pools compute at the same time, and a stale
// rollout generates the next step while the training pool works on this one (on-policy it never does).
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "hybridflow/core/jsonl.h"
#include "hybridflow/report/html_report.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/temp_dir.h"
#include "support/tiny_rl_config.h"

using namespace hybridflow;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

namespace {

constexpr int kSteps = 6;

struct RunResult {
  std::vector<nlohmann::json> metrics;
  std::vector<nlohmann::json> timeline;
  std::map<std::string, double> norms;  // per role
  std::string report;                   // the run's HTML report
};

// PPO on addition prompts, scored by the share of digits in the response: a random policy earns some of it,
// so a few steps show the reward rising.
RunResult train(const std::vector<std::string>& placement) {
  hybridflow::testing::TempDir dir;
  std::vector<std::string> extra = {
      "reward.type=command",
      "reward.shell=/usr/bin/python3 -c \"import sys,json; [print(sum(c.isdigit() for c in "
      "json.loads(l)['response']) / 4.0, flush=True) for l in sys.stdin]\"",
      "trainer.total_steps=" + std::to_string(kSteps),
      "trainer.run_dir=" + dir.path(),
      "data.train_batch_size=4",
      "actor_rollout_ref.actor.ppo_mini_batch_size=2",
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
      "actor_rollout_ref.actor.optim.lr=2e-2",
      "critic.ppo_mini_batch_size=2",
      "critic.ppo_micro_batch_size_per_gpu=4",
      "critic.optim.lr=2e-2",
      "trainer.log_samples_freq=0"};
  extra.insert(extra.end(), placement.begin(), placement.end());
  RunResult run;
  RLTrainer trainer(load_rl_config("", hybridflow::testing::tiny_rl_overrides("gae", extra)));
  trainer.fit();
  run.metrics = read_jsonl(dir.path() + "/metrics.jsonl");
  run.timeline = read_jsonl(dir.path() + "/timeline.jsonl");
  run.report = report::render_html_report(dir.path());
  for (const std::string& role : trainer.roles())
    if (role == "actor" || role == "critic" || role == "rollout") run.norms[role] = trainer.parameter_sq_norm(role);
  return run;
}

const RunResult& colocate() {
  static const RunResult run = train({"trainer.placement=colocate"});
  return run;
}

// What does not depend on the clock or on where the processes are: everything but timings, throughput,
// seconds, memory, the weight sync's own figures and the bytes each transport path moved (perf/*_bytes:
// with pools apart, the data plane carries between workers what colocated roles never send).
bool placement_independent(const std::string& key) {
  const bool seconds = key.size() > 2 && key.compare(key.size() - 2, 2, "_s") == 0;
  return !seconds && key.rfind("timing/", 0) != 0 && key.rfind("perf/throughput", 0) != 0 &&
         key.rfind("memory/", 0) != 0 && key.rfind("weight_sync/", 0) != 0 && key != "perf/controller_bytes" &&
         key != "perf/worker_to_worker_bytes";
}

void expect_same_numbers_as_colocate(const RunResult& run, const std::string& what) {
  ASSERT_EQ(run.metrics.size(), colocate().metrics.size()) << what;
  for (size_t i = 0; i < run.metrics.size(); ++i) {
    size_t compared = 0;
    for (const auto& [key, value] : colocate().metrics[i].items()) {
      if (!placement_independent(key)) continue;
      ASSERT_TRUE(run.metrics[i].contains(key)) << what << " step " << i + 1 << " lacks " << key;
      EXPECT_EQ(run.metrics[i].at(key), value) << what << " step " << i + 1 << ": " << key;
      ++compared;
    }
    EXPECT_GT(compared, 20u) << what;
  }
  EXPECT_EQ(run.norms.at("actor"), colocate().norms.at("actor")) << what;
  EXPECT_EQ(run.norms.at("critic"), colocate().norms.at("critic")) << what;
}

double score(const RunResult& run, size_t step) { return run.metrics.at(step).at("score/mean").get<double>(); }
double last_scores(const RunResult& run) { return (score(run, kSteps - 1) + score(run, kSteps - 2)) / 2; }

struct Span {
  std::string pool, call;
  double start, end;
};

std::map<int64_t, std::vector<Span>> spans_per_step(const RunResult& run) {
  std::map<int64_t, std::vector<Span>> out;
  for (const auto& row : run.timeline)
    out[row.at("step").get<int64_t>()].push_back({row.at("pool").get<std::string>(), row.at("call").get<std::string>(),
                                                  row.at("start_s").get<double>(), row.at("end_s").get<double>()});
  return out;
}

// Steps in which a call of `a` (pool and call) and one of `b` ran at the same time; the others' spans go to
// `missing`, for the failure message.
int overlapping_steps(const RunResult& run, const std::string& pool_a, const std::set<std::string>& calls_a,
                      const std::string& pool_b, const std::set<std::string>& calls_b, std::string* missing = nullptr) {
  int steps = 0;
  for (const auto& [step, spans] : spans_per_step(run)) {
    bool overlap = false;
    for (const Span& a : spans)
      for (const Span& b : spans)
        overlap = overlap || (a.pool == pool_a && calls_a.count(a.call) && b.pool == pool_b && calls_b.count(b.call) &&
                              a.start < b.end && b.start < a.end);
    steps += overlap;
    if (!overlap && missing) {
      *missing += "step " + std::to_string(step) + ":";
      for (const Span& s : spans)
        *missing += " " + s.pool + "/" + s.call + "[" + std::to_string(s.start) + "," + std::to_string(s.end) + "]";
      *missing += "\n";
    }
  }
  return steps;
}

void expect_memory_of_pools(const RunResult& run, const std::vector<std::string>& pools) {
  const auto& last = run.metrics.back();
  for (const std::string& pool : pools) {
    const std::string key = "memory/" + pool + "/peak_rss_bytes";
    ASSERT_TRUE(last.contains(key)) << key << " in " << last.dump();
    EXPECT_GT(last.at(key).get<double>(), 1e7) << key << ": a worker with libtorch holds more than 10 MB";
    EXPECT_GE(last.at(key).get<double>(), last.at("memory/" + pool + "/rss_bytes").get<double>()) << key;
  }
  EXPECT_GT(last.at("memory/controller/peak_rss_bytes").get<double>(), 1e7);
}

const std::set<std::string> kActorTraining = {"actor.compute_log_prob", "actor.update_actor"};
const std::set<std::string> kCriticTraining = {"critic.compute_values", "critic.update_critic"};
const std::set<std::string> kTraining = {"actor.compute_log_prob", "critic.compute_values", "actor.update_actor",
                                         "critic.update_critic"};

TEST(Placements, ColocateLearnsAndLogsItsPoolsMemory) {
  const RunResult& run = colocate();
  ASSERT_EQ(run.metrics.size(), static_cast<size_t>(kSteps));
  EXPECT_GT(last_scores(run), score(run, 0) + 0.1) << "the digit reward rises within " << kSteps << " steps";
  expect_memory_of_pools(run, {"global"});
  EXPECT_EQ(run.metrics.back().at("rollout/staleness_max"), 0.0);
}

TEST(Placements, StandaloneOnPolicyIsColocateBitForBitWithTheWeightsSynced) {
  const RunResult run = train({"trainer.placement=standalone"});
  expect_same_numbers_as_colocate(run, "standalone, staleness 0");
  // After the last sync the rollout pool's shadow copy is the actor, bit for bit.
  EXPECT_EQ(run.norms.at("rollout"), run.norms.at("actor"));
  const auto& last = run.metrics.back();
  EXPECT_GT(last.at("weight_sync/bytes").get<double>(), 0);
  EXPECT_EQ(last.at("weight_sync/policy_version").get<double>(), kSteps);
  EXPECT_EQ(last.at("rollout/staleness_max").get<double>(), 0);
  expect_memory_of_pools(run, {"train", "rollout"});
  // Generation waits for the new weights and training for the rollout: never at the same time.
  EXPECT_EQ(overlapping_steps(run, "rollout", {"rollout.generate_sequences"}, "train", kTraining), 0);
  // The report's timeline draws the rollout pool's row and the sync's calls.
  for (const char* text : {">rollout</text>", "rollout.receive_weights", "actor.send_weights", "rollout.generate_sequences"})
    EXPECT_NE(run.report.find(text), std::string::npos) << text;
  for (const auto& [step, spans] : spans_per_step(run)) {
    std::set<std::string> calls;
    for (const Span& s : spans) calls.insert(s.pool + " " + s.call);
    for (const char* call : {"rollout rollout.generate_sequences", "rollout rollout.receive_weights", "train actor.send_weights"})
      EXPECT_TRUE(calls.count(call)) << "step " << step << " lacks " << call;
  }
}

TEST(Placements, SplitAndAPoolsSectionGiveColocatesNumbersAndOverlapTheirPools) {
  const RunResult split = train({"trainer.placement=split"});
  expect_same_numbers_as_colocate(split, "split");
  expect_memory_of_pools(split, {"actor", "critic"});
  // The actor's log-probs and the critic's values are dispatched together, and so are the two updates: each
  // pair runs on its own two pools. (The tiny model's calls take a millisecond or two, so on loaded cores a
  // step may see them one after the other; at least half the steps must show them side by side.)
  std::string missing;
  EXPECT_GE(overlapping_steps(split, "actor", kActorTraining, "critic", kCriticTraining, &missing), kSteps / 2)
      << missing;

  const RunResult pools = train({"pools.learner.processes=1", "pools.learner.roles=[actor]", "pools.gen.processes=1",
                           "pools.gen.roles=[rollout]", "pools.values.processes=1", "pools.values.roles=[critic]"});
  expect_same_numbers_as_colocate(pools, "pools: learner, gen, values");
  expect_memory_of_pools(pools, {"learner", "gen", "values"});
  EXPECT_GE(overlapping_steps(pools, "learner", kActorTraining, "values", kCriticTraining), kSteps / 2);
}

// Two actor replicas send to two rollout replicas (each reads its own actor replica): the weights and the
// split of the prompts over the replicas are the colocated two-process run's, and so is every number.
TEST(Placements, TwoRolloutReplicasFedByTwoActorReplicasMatchTwoColocatedProcesses) {
  const std::vector<std::string> two = {"actor_rollout_ref.num_processes=2", "trainer.total_steps=2",
                                        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                                        "critic.ppo_micro_batch_size_per_gpu=2"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), two.begin(), two.end());
    return train(extra);
  };
  const RunResult colocated = with({"trainer.placement=colocate"});
  const RunResult standalone = with({"trainer.placement=standalone", "actor_rollout_ref.rollout.num_processes=2"});
  ASSERT_EQ(standalone.metrics.size(), 2u);
  for (size_t i = 0; i < 2; ++i)
    for (const auto& [key, value] : colocated.metrics[i].items()) {
      if (placement_independent(key)) {
        EXPECT_EQ(standalone.metrics[i].at(key), value) << "step " << i + 1 << ": " << key;
      }
    }
  EXPECT_EQ(standalone.norms.at("rollout"), standalone.norms.at("actor"));
  EXPECT_EQ(standalone.norms.at("actor"), colocated.norms.at("actor"));
}

TEST(Placements, OneStepOffPolicyOverlapsGenerationWithTrainingAndLearnsAsWell) {
  const RunResult run = train({"trainer.placement=standalone", "actor_rollout_ref.rollout.staleness=1",
                         "algorithm.rollout_correction.rollout_is=token"});
  ASSERT_EQ(run.metrics.size(), static_cast<size_t>(kSteps));
  // Step 1 trains on the initial policy's samples; every later step on samples one update old.
  EXPECT_EQ(run.metrics[0].at("rollout/staleness_max").get<double>(), 0);
  for (int i = 1; i < kSteps; ++i) EXPECT_EQ(run.metrics[i].at("rollout/staleness_mean").get<double>(), 1) << i;
  EXPECT_TRUE(run.metrics.back().contains("rollout_corr/rollout_is_mean"));
  EXPECT_GT(run.metrics.back().at("rollout_corr/k3_kl").get<double>(), 0) << "one update apart, the policies differ";
  // Every step but the last generates the next one's rollout while the training pool works (at least half
  // of them must show it, as above).
  std::string missing;
  EXPECT_GE(overlapping_steps(run, "rollout", {"rollout.generate_sequences"}, "train", kTraining, &missing),
            (kSteps - 1) / 2)
      << missing;
  EXPECT_GT(last_scores(run), score(run, 0) + 0.1);
  EXPECT_NEAR(last_scores(run), last_scores(colocate()), 0.25) << "learns about as well as on-policy training";
}

// Streaming with bounded staleness k: the rollout pool runs up to k steps ahead of the trainer, and every
// sample's recorded policy version is at most k updates behind the one that trains on it (exactly k once
// the buffer is full); the buffer holds the rollouts of the next min(k, steps left) steps.
TEST(Placements, StalenessKTrainsNoSampleMoreThanKVersionsAfterItsPolicy) {
  for (int k : {2, 3}) {
    const RunResult run = train({"trainer.placement=standalone", "actor_rollout_ref.rollout.staleness=" + std::to_string(k)});
    ASSERT_EQ(run.metrics.size(), static_cast<size_t>(kSteps));
    for (int i = 0; i < kSteps; ++i) {
      const auto& m = run.metrics[i];
      EXPECT_EQ(m.at("rollout/staleness_max").get<double>(), std::min(i, k)) << "k " << k << " step " << i + 1;
      EXPECT_EQ(m.at("rollout/staleness_mean").get<double>(), std::min(i, k)) << "k " << k << " step " << i + 1;
      EXPECT_EQ(m.at("rollout/buffer_batches").get<double>(), std::min(k, kSteps - 1 - i)) << "k " << k << " step " << i + 1;
      EXPECT_GE(m.at("timing/trainer_idle_s").get<double>(), 0.0);
    }
  }
}

// trigger_parameter_sync_step 2 with staleness 2: weights reach the rollout after every second update, and
// the pool waits for them once the buffer would hold samples older than 2 versions: the staleness alternates
// 2, 1 (versions 0, 0, 0, 2, 2, 4 for steps 1-6).
TEST(Placements, WeightsSyncedEveryTwoUpdatesKeepTheStalenessBound) {
  const RunResult run = train({"trainer.placement=standalone", "actor_rollout_ref.rollout.staleness=2",
                               "actor_rollout_ref.rollout.trigger_parameter_sync_step=2"});
  ASSERT_EQ(run.metrics.size(), static_cast<size_t>(kSteps));
  const double want_staleness[kSteps] = {0, 1, 2, 1, 2, 1};
  const double want_buffer[kSteps] = {2, 1, 2, 1, 1, 0};
  for (int i = 0; i < kSteps; ++i) {
    const auto& m = run.metrics[i];
    EXPECT_EQ(m.at("rollout/staleness_max").get<double>(), want_staleness[i]) << "step " << i + 1;
    EXPECT_EQ(m.at("rollout/buffer_batches").get<double>(), want_buffer[i]) << "step " << i + 1;
    // A sync after the even-numbered updates only.
    EXPECT_EQ(m.contains("weight_sync/policy_version"), (i + 1) % 2 == 0) << "step " << i + 1;
  }
}

}  // namespace
