#include "hybridflow/trainer/metrics_log.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <thread>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/jsonl.h"
#include "hybridflow/core/progress.h"
#include "support/temp_dir.h"

namespace hybridflow {
namespace {

TEST(StageTimer, ScopesAccumulatePerStageInFirstSeenOrder) {
  StageTimer timer;
  {
    auto t = timer.scope("generate");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  timer.add("reward", 0.5);
  {
    auto t = timer.scope("generate");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(timer.stages().size(), 2u);
  EXPECT_EQ(timer.stages()[0].first, "generate");
  EXPECT_EQ(timer.stages()[1].first, "reward");
  EXPECT_GE(timer.seconds("generate"), 0.04);
  EXPECT_LT(timer.seconds("generate"), 2.0);
  EXPECT_DOUBLE_EQ(timer.seconds("reward"), 0.5);
  EXPECT_DOUBLE_EQ(timer.seconds("never"), 0.0);
  EXPECT_DOUBLE_EQ(timer.total_seconds(), timer.seconds("generate") + 0.5);
  timer.reset();
  EXPECT_TRUE(timer.stages().empty());
}

TEST(StageTimer, ScopeRecordsTimeWhenTheStageThrows) {
  StageTimer timer;
  try {
    auto t = timer.scope("update_actor");
    throw std::runtime_error("boom");
  } catch (const std::runtime_error&) {
  }
  ASSERT_EQ(timer.stages().size(), 1u);
  EXPECT_GE(timer.seconds("update_actor"), 0.0);
}

TEST(MetricsLog, WritesOneLinePerStepAndClears) {
  testing::TempDir dir;
  std::string run_dir = dir.file("run/nested");
  MetricsLog log(run_dir);
  EXPECT_EQ(log.path(), run_dir + "/metrics.jsonl");

  StageTimer timer;
  timer.add("generate", 1.25);
  timer.add("update_actor", 0.75);
  log.set("reward/mean", 0.5);
  log.set("actor/kl", std::nan(""));
  log.add_timings(timer);
  nlohmann::json first = log.end_step(1);
  EXPECT_TRUE(log.current().empty());
  log.set("reward/mean", 0.75);
  log.end_step(2);

  std::vector<nlohmann::json> rows = read_jsonl(log.path());
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0], first);
  EXPECT_EQ(rows[0]["step"], 1);
  EXPECT_DOUBLE_EQ(rows[0]["reward/mean"].get<double>(), 0.5);
  EXPECT_TRUE(rows[0]["actor/kl"].is_null());
  EXPECT_DOUBLE_EQ(rows[0]["timing/generate_s"].get<double>(), 1.25);
  EXPECT_DOUBLE_EQ(rows[0]["timing/update_actor_s"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(rows[0]["timing/step_s"].get<double>(), 2.0);
  EXPECT_EQ(rows[1], (nlohmann::json{{"step", 2}, {"reward/mean", 0.75}}));

  // A resumed run appends to the same file.
  MetricsLog resumed(run_dir);
  resumed.set("reward/mean", 1.0);
  resumed.end_step(3);
  EXPECT_EQ(read_jsonl(log.path()).size(), 3u);
}

TEST(MetricsLog, InMemoryOnlyWritesNoFile) {
  MetricsLog log("");
  log.set("x", 1);
  EXPECT_EQ(log.end_step(0)["x"], 1.0);
  EXPECT_EQ(log.path(), "");
}

TEST(MetricsLog, RejectsReservedNames) {
  MetricsLog log("");
  EXPECT_THROW(log.set("step", 1), Error);
  EXPECT_THROW(log.set("", 1), Error);
}

TEST(MetricsLog, FormatsProgressLines) {
  nlohmann::json record = {{"step", 3}, {"reward/mean", 0.51234}, {"timing/step_s", 12.0}, {"kl", nullptr}};
  EXPECT_EQ(MetricsLog::format_progress(record, 100, {"reward/mean", "missing", "timing/step_s"}),
            "step 3/100 | reward/mean 0.5123 | timing/step_s 12");
  EXPECT_EQ(MetricsLog::format_progress(record, 0, {"kl"}), "step 3 | kl nan");
  std::string all = MetricsLog::format_progress(record, 0);
  EXPECT_NE(all.find("reward/mean 0.5123"), std::string::npos) << all;
  EXPECT_NE(all.find("timing/step_s 12"), std::string::npos) << all;
  EXPECT_EQ(all.find("| step"), std::string::npos) << all;
}

TEST(MetricsLog, ProgressLineEndsWithAnEta) {
  nlohmann::json record = {{"step", 3}, {"reward/mean", 0.5}, {"actor/ref_kl", 0.01}};
  // 3 steps took 30 s: 7 more take 70 s.
  EXPECT_DOUBLE_EQ(eta_seconds(30.0, 3, 7), 70.0);
  EXPECT_DOUBLE_EQ(eta_seconds(30.0, 3, 0), 0.0);
  EXPECT_TRUE(std::isnan(eta_seconds(0.0, 0, 10)));  // nothing done yet: unknown
  EXPECT_EQ(MetricsLog::format_progress(record, 10, {"reward/mean", "actor/ref_kl"}, eta_seconds(30.0, 3, 7)),
            "step 3/10 | reward/mean 0.5 | actor/ref_kl 0.01 | ETA 1m10s");
  EXPECT_EQ(MetricsLog::format_progress(record, 10, {"reward/mean"}, eta_seconds(0.0, 0, 10)),
            "step 3/10 | reward/mean 0.5 | ETA ?");
  EXPECT_EQ(MetricsLog::format_progress(record, 10, {"reward/mean"}, 2 * 3600 + 5 * 60),
            "step 3/10 | reward/mean 0.5 | ETA 2h05m");
  EXPECT_EQ(MetricsLog::format_progress(record, 10, {"reward/mean"}), "step 3/10 | reward/mean 0.5");
}

}  // namespace
}  // namespace hybridflow
