// The calibration file round-trips, names what is missing, lives where the environment says, and the fit
// recovers known constants.
#include <gtest/gtest.h>

#include <cstdlib>

#include "hybridflow/core/error.h"
#include "hybridflow/placement/calibration.h"
#include "support/temp_dir.h"

using namespace hybridflow::placement;

namespace {

Calibration sample() {
  Calibration c;
  c.created = "2025-01-01T00:00:00Z";
  c.host = "box";
  c.load_average = 1.5;
  c.cores = 2;
  c.memory_bytes = 8e9;
  c.matmul_flops = 100e9;
  c.memory_bandwidth = 10e9;
  c.allreduce_bandwidth = 2e9;
  c.allreduce_latency_s = 20e-6;
  c.compute_efficiency = 0.8;
  c.overheads = {0.01, 1e-3, 2e-4, 5e-4, 0.05};
  CalibrationCheck check;
  check.placement = "colocate";
  check.layout = "{actor}x2";
  check.use = "check";
  check.measured_s = 0.5;
  check.predicted_s = 0.55;
  check.calls["actor.update_actor"] = {0.2, 0.25};
  c.checks.push_back(check);
  return c;
}

}  // namespace

TEST(Calibration, RoundTripsThroughJsonAndAFile) {
  const Calibration c = sample();
  const Calibration back = Calibration::from_json(c.to_json(), "test");
  EXPECT_EQ(back.to_json(), c.to_json());
  EXPECT_NEAR(back.checks.at(0).error(), 0.1, 1e-12);
  hybridflow::testing::TempDir dir;
  const std::string path = dir.path() + "/sub/calibration.json";
  save_calibration(path, c);
  EXPECT_EQ(load_calibration(path).to_json(), c.to_json());
}

TEST(Calibration, AsyncSpeedupPairsEachStalenessWithStalenessZero) {
  Calibration c = sample();
  CalibrationCheck at0, at2;
  at0.placement = at2.placement = "standalone";
  at0.layout = at2.layout = "{actor}x1 {rollout}x1";
  at0.use = at2.use = "async";
  at0.measured_s = 1.2, at0.predicted_s = 1.0;
  at2.staleness = 2;
  at2.measured_s = 0.8, at2.predicted_s = 0.625;
  c.checks.push_back(at0);
  c.checks.push_back(at2);
  const std::vector<SpeedupCheck> s = async_speedups(Calibration::from_json(c.to_json(), "test"));
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].staleness, 2);
  EXPECT_DOUBLE_EQ(s[0].measured, 1.5);   // 1.2 / 0.8
  EXPECT_DOUBLE_EQ(s[0].predicted, 1.6);  // 1.0 / 0.625
  EXPECT_NEAR(s[0].error(), 0.1 / 1.5, 1e-12);
  // A file written before the async checks existed reads as staleness 0 and pairs nothing.
  nlohmann::json old = sample().to_json();
  old["checks"][0].erase("staleness");
  EXPECT_TRUE(async_speedups(Calibration::from_json(old, "old.json")).empty());
}

TEST(Calibration, MissingFieldsAndFilesAreNamed) {
  nlohmann::json j = sample().to_json();
  j.erase("matmul_flops");
  try {
    Calibration::from_json(j, "cal.json");
    FAIL();
  } catch (const hybridflow::Error& e) {
    EXPECT_NE(std::string(e.what()).find("matmul_flops"), std::string::npos) << e.what();
  }
  try {
    load_calibration("/nonexistent/calibration.json");
    FAIL();
  } catch (const hybridflow::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--calibrate"), std::string::npos) << e.what();
  }
}

TEST(Calibration, DeviceIsOneCoreWithTheMeasuredFigures) {
  const ClusterSpec d = sample().device();
  EXPECT_EQ(d.name, "this-machine");
  EXPECT_EQ(d.compute_units, 2);
  EXPECT_EQ(d.gpus_per_node, 2);
  EXPECT_DOUBLE_EQ(d.memory_bytes, 4e9);
  EXPECT_DOUBLE_EQ(d.peak_flops, 100e9);
  EXPECT_DOUBLE_EQ(d.forward_efficiency, 0.8);
  EXPECT_DOUBLE_EQ(d.overheads.decode_step_s, 5e-4);
}

TEST(Calibration, DefaultPathFollowsTheEnvironment) {
  ::setenv("HF_CALIBRATION", "/x/cal.json", 1);
  EXPECT_EQ(default_calibration_path(), "/x/cal.json");
  ::unsetenv("HF_CALIBRATION");
  ::setenv("XDG_CACHE_HOME", "/cache", 1);
  EXPECT_EQ(default_calibration_path(), "/cache/hybridflow/calibration.json");
  ::unsetenv("XDG_CACHE_HOME");
  ::setenv("HOME", "/home/u", 1);
  EXPECT_EQ(default_calibration_path(), "/home/u/.cache/hybridflow/calibration.json");
}

TEST(Calibration, FitRecoversKnownConstants) {
  // Rows made from a = 1.25, 10 ms a call, 2 ms a micro-batch pass, 200 us a layer pass, 500 us a decode step.
  std::vector<FitRow> rows;
  const double counts[][4] = {{1, 2, 8, 0}, {1, 6, 24, 0}, {1, 2, 72, 16}, {1, 12, 40, 32}, {1, 1, 8, 8}, {1, 24, 100, 4},
                              {1, 3, 12, 12}};
  const double compute[] = {0.02, 0.05, 0.01, 0.2, 0.001, 0.03, 0.07};
  for (int i = 0; i < 7; ++i) {
    FitRow r;
    r.compute_s = compute[i];
    r.fixed_s = 0.001 * i;
    for (int k = 0; k < 4; ++k) r.counts[k] = counts[i][k];
    r.measured_s = 1.25 * r.compute_s + r.fixed_s + 0.01 * counts[i][0] + 2e-3 * counts[i][1] + 2e-4 * counts[i][2] +
                   5e-4 * counts[i][3];
    rows.push_back(r);
  }
  const FitResult f = fit_overheads(rows);
  EXPECT_NEAR(f.compute_scale, 1.25, 1e-5);
  EXPECT_NEAR(f.call_s, 0.01, 1e-7);
  EXPECT_NEAR(f.micro_batch_s, 2e-3, 1e-8);
  EXPECT_NEAR(f.layer_pass_s, 2e-4, 1e-9);
  EXPECT_NEAR(f.decode_step_s, 5e-4, 1e-9);
  EXPECT_LT(f.rms_relative_error, 1e-6);
}
