// The profiler window on the CPU: operators by name, hybridflow's named phases (user scopes, nested ones
// each counted in full), the options verl's contents map to, the Chrome trace and the JSON summary.
#include "hybridflow/core/kineto_profile.h"

#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hybridflow/core/fs.h"
#include "support/temp_dir.h"

namespace hybridflow {
namespace {

TEST(KinetoProfile, NamedPhasesHoldTheirOperatorsTime) {
  hybridflow::testing::TempDir dir;
  const torch::Tensor a = torch::randn({256, 256}), b = torch::randn({256, 256});
  torch::Tensor out;
  ProfileOptions options;
  options.shapes = true;
  const ProfileWindow w = profile_call(
      [&] {
        RECORD_USER_SCOPE("hf::outer");
        for (int i = 0; i < 3; ++i) {
          RECORD_USER_SCOPE("hf::inner");
          out = a.mm(b);
        }
        out = torch::add(out, a);
      },
      [] {}, options, dir.file("trace.json"));
  ASSERT_EQ(w.scopes.count("hf::outer"), 1u);
  ASSERT_EQ(w.scopes.count("hf::inner"), 1u);
  EXPECT_EQ(w.scopes.at("hf::outer").calls, 1);
  EXPECT_EQ(w.scopes.at("hf::inner").calls, 3);
  EXPECT_GT(w.scopes.at("hf::inner").host_seconds, 0);
  // The outer phase holds the inner ones and the addition besides.
  EXPECT_GT(w.scopes.at("hf::outer").host_seconds, w.scopes.at("hf::inner").host_seconds);
  EXPECT_LE(w.scopes.at("hf::outer").host_seconds, w.wall_seconds);
  // Three products inside the inner phase, and the addition besides them in the outer one.
  EXPECT_GE(w.scopes.at("hf::inner").operator_calls, 3);
  EXPECT_LT(w.scopes.at("hf::inner").operator_calls, w.scopes.at("hf::outer").operator_calls);
  EXPECT_EQ(w.operators.at("aten::mm").calls, 3);
  EXPECT_EQ(w.operators.at("aten::add").calls, 1);
  EXPECT_GE(w.operator_calls, 4);  // the scopes are not operators
  EXPECT_EQ(w.operators.count("hf::inner"), 0u);
  EXPECT_FALSE(w.cuda);

  // Input shapes asked for: the trace records the multiplication's [256, 256] inputs.
  const nlohmann::json trace = nlohmann::json::parse(read_file(dir.file("trace.json")));
  bool mm_with_dims = false;
  for (const auto& e : trace.at("traceEvents"))
    if (e.value("name", "") == "aten::mm" && e.contains("args") && e["args"].contains("Input Dims"))
      mm_with_dims = e["args"]["Input Dims"].dump().find("[256,256]") != std::string::npos;
  EXPECT_TRUE(mm_with_dims);

  const nlohmann::json summary = profile_summary_json(w, 2);
  EXPECT_EQ(summary["device"], "cpu");
  EXPECT_EQ(summary["top_operators"].size(), 2u);
  EXPECT_EQ(summary["top_operators"][0]["name"], "aten::mm");  // three 256^3 products outweigh one addition
  EXPECT_EQ(summary["scopes"]["hf::inner"]["calls"], 3);
  EXPECT_FALSE(summary.contains("kernels"));
}

TEST(KinetoProfile, ATraceThatCannotBeWrittenIsReportedNotThrown) {
  torch::Tensor out;
  const ProfileWindow w = profile_call([&] { out = torch::ones({4}).sum(); }, [] {}, ProfileOptions{},
                                       "/proc/hybridflow-no-such-dir/trace.json");
  EXPECT_EQ(out.item<float>(), 4.0f);  // the work ran and its result stands
  EXPECT_FALSE(w.trace_error.empty());
  EXPECT_EQ(w.operators.count("aten::sum"), 1u);
}

TEST(KinetoProfile, AFailingCallStopsTheProfilerAndRethrows) {
  EXPECT_THROW(profile_call([] { throw std::runtime_error("bad"); }, [] {}, ProfileOptions{}), std::runtime_error);
  // The profiler is off again: a second window starts.
  const ProfileWindow w = profile_call([] { torch::ones({4}).sum(); }, [] {}, ProfileOptions{});
  EXPECT_EQ(w.operators.count("aten::sum"), 1u);
}

}  // namespace
}  // namespace hybridflow
