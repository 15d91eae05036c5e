// The model a training role holds (workers/trainable_model.h) on one process: an update call trains it
// and reports the optimizer state it keeps under the role's prefix (Adam's moments, plus fp32 masters for
// bf16 weights), and a checkpoint brings a differently initialised model and its optimizer back so that the
// next update repeats bit for bit, in fp32 and in bf16; a checkpoint call without its directory is refused.
#include "hybridflow/workers/trainable_model.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/error_of.h"
#include "support/temp_dir.h"
#include "workers/value_training_fixture.h"

using namespace hybridflow;

namespace {

using hybridflow::testing::value_training_update;

std::unique_ptr<TrainableModel> value_model(const std::string& dtype, uint64_t seed) {
  return hybridflow::testing::value_training_model(hybridflow::testing::value_training_model_spec(dtype, seed));
}

DataProto update(TrainableModel& m, MetricAverager& metrics) { return value_training_update(m, metrics); }
torch::Tensor parameters(TrainableModel& m) { return hybridflow::testing::value_training_parameters(m); }

class TrainableModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainableModelTest, UpdateTrainsAndReportsItsOptimizerState) {
  auto m = value_model(GetParam(), 1);
  const torch::Tensor before = parameters(*m);
  MetricAverager metrics;
  const DataProto out = update(*m, metrics);
  const torch::Tensor after = parameters(*m);
  EXPECT_FALSE(torch::equal(before, after));
  EXPECT_EQ(m->model()->parameters().front().scalar_type(), GetParam() == "bf16" ? torch::kBFloat16 : torch::kFloat);

  ASSERT_TRUE(out.has_tensor("update_rank"));
  EXPECT_EQ(out.tensor("update_rank").item<int64_t>(), 0);
  const nlohmann::json& reported = out.meta().at("metrics");
  EXPECT_TRUE(reported.contains("critic/grad_norm")) << reported.dump();
  // Adam's two moments of every parameter, and a third fp32 copy (the masters) for bf16 weights.
  const int64_t copies = GetParam() == "bf16" ? 3 : 2;
  EXPECT_EQ(reported.at("critic/optimizer_state_bytes").get<double>(), static_cast<double>(copies * after.size(1) * 4));
  EXPECT_FALSE(out.meta().contains("comm"));  // one process: no data-parallel group

  const double norm = m->parameter_norm().tensor("param_sq_norm").item<double>();
  EXPECT_NEAR(norm, after.to(torch::kDouble).pow(2).sum().item<double>(), 1e-6 * norm);
}

TEST_P(TrainableModelTest, CheckpointRepeatsTheNextUpdateBitForBit) {
  hybridflow::testing::TempDir dir;
  using hybridflow::testing::value_training_model_spec;
  hybridflow::testing::expect_checkpoint_repeats_next_update(value_training_model_spec(GetParam(), 1),
                                                             value_training_model_spec(GetParam(), 2), dir.path());
}

TEST_P(TrainableModelTest, CheckpointCallsNameTheMetaTheyNeed) {
  auto m = value_model(GetParam(), 1);
  EXPECT_NE(hybridflow::testing::error_of([&] { m->save_checkpoint(DataProto()); }).find("meta 'dir' and 'tokenizer'"),
            std::string::npos);
  EXPECT_NE(hybridflow::testing::error_of([&] { m->load_checkpoint(DataProto()); }).find("meta 'dir'"),
            std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, TrainableModelTest, ::testing::Values("fp32", "bf16"));

}  // namespace
