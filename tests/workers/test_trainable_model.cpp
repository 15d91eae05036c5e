// The model a training role holds (workers/trainable_model.h) on one process: an update call trains it
// and reports the optimizer state it keeps under the role's prefix (Adam's moments, plus fp32 masters for
// bf16 weights), and a checkpoint brings a differently initialised model and its optimizer back so that the
// next update repeats bit for bit, in fp32 and in bf16; a checkpoint call without its directory is refused.
#include "hybridflow/workers/trainable_model.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hybridflow/model/tokenizer.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

using namespace hybridflow;

namespace {

// The addition task's alphabet: the tokenizer saved with a checkpoint, and the model's vocabulary.
const Tokenizer kAlphabet = Tokenizer::from_alphabet("0123456789+=");

// A one-layer value model of the tiny preset; `seed` draws its weights.
ModelSpec tiny_spec(const std::string& dtype, uint64_t seed) {
  ModelSpec s;
  s.vocab_size = kAlphabet.vocab_size();
  s.num_hidden_layers = 1;
  s.init_seed = seed;
  s.dtype = dtype;
  return s;
}

TrainSpec train_spec() {
  TrainSpec t;
  t.optim.schedule.lr = 1e-2;
  t.mini_batch_rows = 2;   // two optimizer steps per epoch
  t.micro_batch_rows = 1;  // each accumulated over two micro-batches
  t.epochs = 2;
  return t;
}

WorkerContext critic_context() {
  WorkerContext c;
  c.role = "critic";
  return c;
}

std::unique_ptr<TrainableModel> value_model(const std::string& dtype, uint64_t seed) {
  return std::make_unique<TrainableModel>(critic_context(), torch::Device(torch::kCPU), nullptr,
                                          tiny_spec(dtype, seed), HeadKind::kValue, train_spec());
}

DataProto batch() {
  DataProto b;
  b.set_tensor("input_ids", torch::tensor({{1, 2, 3, 4, 5}, {6, 7, 8, 9, 10}, {3, 1, 4, 1, 5}, {9, 2, 6, 5, 3}},
                                          torch::kLong));
  b.set_tensor("attention_mask", torch::ones({4, 5}, torch::kLong));
  b.set_tensor("response_mask", torch::ones({4, 2}, torch::kLong));
  return b;
}

// Every position's value regressed toward 1.
DataProto update(TrainableModel& m, MetricAverager& metrics) {
  auto on = m.params_on_device();
  auto loss = [&m](const DataProto& micro) {
    auto values = m.model()->forward(micro.tensor("input_ids"), micro.tensor("attention_mask")).values;
    return (values.to(torch::kFloat) - 1).pow(2).mean();
  };
  return m.update(batch(), mini_batch_plan(train_spec(), nlohmann::json::object()), loss, "critic/", metrics,
                  "update_critic");
}

DataProto update(TrainableModel& m) {
  MetricAverager metrics;
  return update(m, metrics);
}

torch::Tensor parameters(TrainableModel& m) { return m.flat_parameters().tensor("parameters"); }

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
  const std::string tok = dir.file("tokenizer.json");
  kAlphabet.save(tok);
  DataProto save, load;
  save.meta() = {{"dir", dir.file("ckpt")}, {"tokenizer", tok}};
  load.meta() = {{"dir", dir.file("ckpt")}};

  auto saved = value_model(GetParam(), 1);
  update(*saved);  // the optimizer has state and a step count to restore
  saved->save_checkpoint(save);
  const torch::Tensor at_save = parameters(*saved);
  update(*saved);

  auto resumed = value_model(GetParam(), 2);
  ASSERT_FALSE(torch::equal(parameters(*resumed), at_save));
  resumed->load_checkpoint(load);
  EXPECT_TRUE(torch::equal(parameters(*resumed), at_save));
  update(*resumed);
  EXPECT_TRUE(torch::equal(parameters(*resumed), parameters(*saved)));
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
