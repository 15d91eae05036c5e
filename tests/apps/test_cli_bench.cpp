// `hybridflow bench` on a tiny shape: every JSON line parses and carries positive, finite figures with
// ratios in a sane range. No timing thresholds: the machine running the tests may be loaded.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "support/run_command.h"
#include "support/temp_dir.h"

namespace {

using hybridflow::testing::CommandResult;
using hybridflow::testing::run_hybridflow;

const std::string kTiny = " --hidden-size 64 --layers 2 --heads 4 --vocab 128 --prompt-length 8 --json";

// The JSON lines of the output (a warning line on stderr, if any, is skipped).
std::vector<nlohmann::json> json_lines(const std::string& output) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] == '{') lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

void expect_sane(const nlohmann::json& m) {
  SCOPED_TRACE(m.dump());
  for (const char* key : {"what", "batch", "tokens_per_s", "roofline_ratio", "achieved", "bound", "units"})
    ASSERT_TRUE(m.contains(key)) << key;
  for (const char* key : {"tokens_per_s", "achieved", "bound", "roofline_ratio"}) {
    const double v = m[key].get<double>();
    EXPECT_TRUE(std::isfinite(v) && v > 0) << key << " = " << v;
  }
  EXPECT_LT(m["roofline_ratio"].get<double>(), 10.0);
}

TEST(CliBench, MachineMeasuresBandwidthAndMatmuls) {
  CommandResult r = run_hybridflow("bench machine --stream-mb 16 --batch 1" + kTiny);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto lines = json_lines(r.output);
  std::set<std::string> what;
  for (const auto& m : lines) {
    expect_sane(m);
    what.insert(m["what"].get<std::string>());
  }
  EXPECT_TRUE(what.count("stream triad")) << r.output;
  EXPECT_TRUE(what.count("matmul pass")) << r.output;
  EXPECT_TRUE(what.count("matmul lm_head")) << r.output;
}

TEST(CliBench, GenerateReportsDecodePrefillAndRollout) {
  // 48 new tokens, not fewer: a shorter decode of this tiny model vanished beside the prefill in a loaded ctest -j 2
  // run, and the bench then refuses to print a rate (as in GenerateReportsHostSynchronisations below).
  CommandResult r = run_hybridflow("bench generate --batch 1,2 --response-length 48 --rollout-prompts 4 --samples 2 "
                                   "--stop-every 4 --max-num-seqs 4 --slots-baseline" + kTiny);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::set<std::string> what;
  double rollout_length = -1, static_length = -2, slots_length = -3;
  for (const auto& m : json_lines(r.output)) {
    expect_sane(m);
    what.insert(m["what"].get<std::string>() + (m["what"] == "decode" ? std::to_string(m["batch"].get<int>()) : ""));
    if (m["what"] == "decode") {
      EXPECT_EQ(m["bound_kind"], m["batch"] == 1 ? "bandwidth" : "matmul");
    }
    if (m["what"] == "rollout" || m["what"] == "rollout static batch" || m["what"] == "rollout slots") {
      EXPECT_EQ(m["batch"], 8);  // 4 prompts x 2 samples
      EXPECT_LE(m["max_length"].get<int>(), 48);
      EXPECT_GT(m["mean_length"].get<double>(), 0.0);
    }
    if (m["what"] == "rollout") {
      EXPECT_EQ(m["max_num_seqs"], 4);
      EXPECT_GT(m["speedup_vs_static"].get<double>(), 0.0);
      rollout_length = m["mean_length"].get<double>();
      // The paged cache (the default) beside the slots in the same run, both peaks reported. (Neither bounds
      // the other: 16-position blocks can hold more than short slots, the slots more when answers stop early.)
      EXPECT_EQ(m["kv_cache"], "paged");
      EXPECT_GT(m["kv_peak_MB"].get<double>(), 0.0);
      EXPECT_GT(m["slots_kv_peak_MB"].get<double>(), 0.0);
      EXPECT_GT(m["speed_vs_slots"].get<double>(), 0.0);
    }
    if (m["what"] == "rollout slots") {
      EXPECT_EQ(m["kv_cache"], "slots");
      slots_length = m["mean_length"].get<double>();
    }
    if (m["what"] == "rollout static batch") static_length = m["mean_length"].get<double>();
  }
  // Both paths draw the same tokens: the same work is timed.
  EXPECT_EQ(rollout_length, static_length);
  EXPECT_EQ(rollout_length, slots_length);
  for (const char* w :
       {"stream triad", "decode1", "decode2", "prefill", "rollout", "rollout static batch", "rollout slots"})
    EXPECT_TRUE(what.count(w)) << w << "\n" << r.output;
}

// Read back every 8 decode steps: the run of 17 new tokens reads the prefill's first tokens, then two chunks
// of 8 steps.
TEST(CliBench, GenerateReportsHostSynchronisations) {
  // 65 new tokens (64 decode steps) rather than fewer: at this size a short decode can vanish in a loaded
  // machine's noise beside the prefill, and the bench then refuses to print a rate.
  CommandResult r = run_hybridflow("bench generate --batch 1,2 --response-length 65 --readback-interval 8 "
                                   "--rollout-prompts 2 --samples 2 --stop-every 4 --no-static-baseline" + kTiny);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  int decode_lines = 0, rollout_lines = 0;
  for (const auto& m : json_lines(r.output)) {
    if (m["what"] == "decode") {
      ++decode_lines;
      EXPECT_EQ(m["readback_interval"], 8);
      // The prefill's first tokens, then one read per chunk of 8 of the 64 decode steps.
      EXPECT_DOUBLE_EQ(m["host_syncs_per_step"].get<double>(), 9.0 / 64.0) << m.dump();
      EXPECT_DOUBLE_EQ(m["host_syncs_per_token"].get<double>(), 9.0 / 64.0 / m["batch"].get<double>()) << m.dump();
    }
    if (m["what"] == "rollout") {
      ++rollout_lines;
      EXPECT_GT(m["host_syncs_per_token"].get<double>(), 0.0) << m.dump();
    }
  }
  EXPECT_EQ(decode_lines, 2) << r.output;
  EXPECT_EQ(rollout_lines, 1) << r.output;
  r = run_hybridflow("bench generate --readback-interval 0" + kTiny);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--readback-interval"), std::string::npos) << r.output;
}

TEST(CliBench, RolloutOnlySkipsDecodeAndPrefill) {
  CommandResult r = run_hybridflow("bench generate --device cpu --rollout-only --no-static-baseline --response-length 4 "
                                   "--rollout-prompts 3 --samples 2 --stop-every 4" + kTiny);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto lines = json_lines(r.output);
  ASSERT_EQ(lines.size(), 1u) << r.output;
  expect_sane(lines[0]);
  EXPECT_EQ(lines[0]["what"], "rollout");
  EXPECT_EQ(lines[0]["batch"], 6);  // 3 prompts x 2 samples
}

TEST(CliBench, TrainReportsTokensPerSecondAgainstMatmuls) {
  CommandResult r = run_hybridflow("bench train --batch 2 --response-length 8 --steps 1 --rl-rows 6 --micro-rows 2 "
                                   "--logits-vocab 256 --logits-tokens 32" + kTiny);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::map<std::string, nlohmann::json> by_what;
  for (const auto& m : json_lines(r.output)) {
    expect_sane(m);
    by_what[m["what"].get<std::string>()] = m;
  }
  for (const char* w : {"train", "train checkpointed", "log-probs padded", "log-probs dynamic bsz", "update padded",
                        "update dynamic bsz", "log-probs head memory"})
    ASSERT_TRUE(by_what.count(w)) << w << "\n" << r.output;
  EXPECT_EQ(by_what["train"]["seq"], 16);
  EXPECT_GT(by_what["train"]["peak_mb"].get<double>(), 0.0);
  EXPECT_GT(by_what["train checkpointed"]["time_ratio"].get<double>(), 0.0);
  // The same rows and real tokens both ways; by token count computes no more than the padded width.
  const auto& padded = by_what["update padded"];
  const auto& dynamic = by_what["update dynamic bsz"];
  EXPECT_EQ(padded["batch"], 6);
  EXPECT_EQ(padded["real_tokens"], dynamic["real_tokens"]);
  EXPECT_EQ(padded["computed_tokens"].get<double>(), 6.0 * 16);
  EXPECT_LE(dynamic["computed_tokens"].get<double>(), padded["computed_tokens"].get<double>());
  EXPECT_GT(dynamic["speedup"].get<double>(), 0.0);
  EXPECT_EQ(by_what["log-probs head memory"]["vocab"], 256);
  EXPECT_EQ(by_what["log-probs head memory"]["units"], "MB");
}

// The decode profile on the CPU: per step of a tiny model's decode, operators are counted (bf16 takes the
// operator-by-operator path a GPU takes: each added decoder layer adds the same count; fp32's fused CPU kernels
// run far fewer), no kernels, the operators with the most self time named, and a Chrome trace written for each
// batch. Times are differences of two runs on a possibly loaded machine: only checked to be numbers.
TEST(CliBench, DecodeProfileCountsOperatorsPerLayer) {
  hybridflow::testing::TempDir dir;
  auto profile = [&](int layers, const std::string& dtype) {
    SCOPED_TRACE("layers " + std::to_string(layers) + ", " + dtype);
    const std::string trace = dir.file("decode" + std::to_string(layers) + dtype + ".json");
    CommandResult r = run_hybridflow("bench generate --profile " + trace + " --profile-steps 4 --batch 1,2 " +
                                     "--hidden-size 64 --heads 4 --vocab 128 --prompt-length 8 --json --dtype " +
                                     dtype + " --layers " + std::to_string(layers));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const auto lines = json_lines(r.output);
    EXPECT_EQ(lines.size(), 2u) << r.output;
    for (const auto& m : lines) {
      SCOPED_TRACE(m.dump());
      EXPECT_EQ(m["what"], "decode profile");
      EXPECT_EQ(m["steps"], 4);
      EXPECT_EQ(m["busy_kind"], "host operators");
      EXPECT_GT(m["operator_calls_per_step"].get<double>(), 0.0);
      EXPECT_EQ(m["kernels_per_step"].get<double>(), 0.0);
      EXPECT_EQ(m["launches_per_step"].get<double>(), 0.0);
      for (const char* key : {"wall_ms_per_step", "busy_ms_per_step", "busy_ratio", "prefill_s"})
        EXPECT_TRUE(std::isfinite(m[key].get<double>())) << key;
      EXPECT_FALSE(m["top"].empty());
      EXPECT_LE(m["top"].size(), 10u);
      for (const auto& op : m["top"]) EXPECT_EQ(op["name"].get<std::string>().rfind("aten::", 0), 0u) << op;
      const std::string path = m["trace"].get<std::string>();
      EXPECT_EQ(path, dir.file("decode" + std::to_string(layers) + dtype + ".batch" +
                               std::to_string(m["batch"].get<int>()) + ".json"));
      std::ifstream in(path);
      EXPECT_TRUE(in.good()) << path;
      if (in.good()) {
        EXPECT_FALSE(nlohmann::json::parse(in)["traceEvents"].empty()) << path;
      }
    }
    return lines.empty() ? 0.0 : lines[0]["operator_calls_per_step"].get<double>();  // batch 1
  };
  const double two = profile(2, "bf16"), three = profile(3, "bf16"), four = profile(4, "bf16");
  const double per_layer = three - two;
  EXPECT_GE(per_layer, 10.0);  // norms, projections, rotary, attention, MLP: many operators a layer
  EXPECT_EQ(four - three, per_layer);
  EXPECT_GT(two, 2 * per_layer);  // plus the embedding, the head and sampling
  EXPECT_LT(profile(4, "fp32"), four);  // the fused CPU decode kernels replace most operators
}

// One training step under the profiler: forward, backward and AdamW run many more operators than a decode
// step of the same model, and the trace is written.
TEST(CliBench, TrainProfileCountsTheStepsOperators) {
  hybridflow::testing::TempDir dir;
  const std::string shape = " --hidden-size 64 --heads 4 --vocab 128 --layers 2 --prompt-length 8 --dtype bf16 --json";
  CommandResult r = run_hybridflow("bench train --batch 2 --response-length 8 --profile " + dir.file("train.json") + shape);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto lines = json_lines(r.output);
  ASSERT_EQ(lines.size(), 1u) << r.output;
  const auto& m = lines[0];
  EXPECT_EQ(m["what"], "train profile");
  EXPECT_EQ(m["seq"], 16);
  EXPECT_EQ(m["steps"], 1);
  EXPECT_EQ(m["trace"], dir.file("train.json"));
  EXPECT_TRUE(std::ifstream(dir.file("train.json")).good());
  r = run_hybridflow("bench generate --batch 2 --profile-steps 1 --profile " + dir.file("decode.json") + shape);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto decode = json_lines(r.output);
  ASSERT_EQ(decode.size(), 1u) << r.output;
  EXPECT_GT(m["operator_calls_per_step"].get<double>(), 2 * decode[0]["operator_calls_per_step"].get<double>())
      << m.dump() << "\n" << decode[0].dump();
}

TEST(CliBench, ErrorsNameTheFlag) {
  CommandResult r = run_hybridflow("bench generate --response-length 1" + kTiny);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--response-length"), std::string::npos) << r.output;
  r = run_hybridflow("bench train --device gpu" + kTiny);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--device"), std::string::npos) << r.output;
  r = run_hybridflow("bench generate --profile x.json --profile-steps 0 --batch 1" + kTiny);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--profile-steps"), std::string::npos) << r.output;
  r = run_hybridflow("bench machine --dtype fp8" + kTiny);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--dtype"), std::string::npos) << r.output;
}

}  // namespace
