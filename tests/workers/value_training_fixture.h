// A one-layer value model trained on one process (the TrainableModel tests': every position's value
// regressed toward 1 over 2 epochs of 2 mini-batches of 2 micro-batches), shared by the tests of training
// with and without LoRA.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>

#include "hybridflow/model/tokenizer.h"
#include "hybridflow/workers/trainable_model.h"

namespace hybridflow::testing {

// The addition task's alphabet: the tokenizer saved with a checkpoint, and the model's vocabulary.
inline const Tokenizer& value_training_alphabet() {
  static const Tokenizer alphabet = Tokenizer::from_alphabet("0123456789+=");
  return alphabet;
}

// A one-layer value model of the tiny preset in `dtype`; `seed` draws its weights.
inline ModelSpec value_training_model_spec(const std::string& dtype, uint64_t seed) {
  ModelSpec s;
  s.vocab_size = value_training_alphabet().vocab_size();
  s.num_hidden_layers = 1;
  s.init_seed = seed;
  s.dtype = dtype;
  return s;
}

inline TrainSpec value_training_spec() {
  TrainSpec t;
  t.optim.schedule.lr = 1e-2;
  t.mini_batch_rows = 2;   // two optimizer steps per epoch
  t.micro_batch_rows = 1;  // each accumulated over two micro-batches
  t.epochs = 2;
  return t;
}

inline std::unique_ptr<TrainableModel> value_training_model(const ModelSpec& spec) {
  WorkerContext context;
  context.role = "critic";
  return std::make_unique<TrainableModel>(context, torch::Device(torch::kCPU), nullptr, spec, HeadKind::kValue,
                                          value_training_spec());
}

inline DataProto value_training_batch() {
  DataProto b;
  b.set_tensor("input_ids", torch::tensor({{1, 2, 3, 4, 5}, {6, 7, 8, 9, 10}, {3, 1, 4, 1, 5}, {9, 2, 6, 5, 3}},
                                          torch::kLong));
  b.set_tensor("attention_mask", torch::ones({4, 5}, torch::kLong));
  b.set_tensor("response_mask", torch::ones({4, 2}, torch::kLong));
  return b;
}

// One update call: every position's value regressed toward 1.
inline DataProto value_training_update(TrainableModel& m, MetricAverager& metrics) {
  auto on = m.params_on_device();
  auto loss = [&m](const DataProto& micro) {
    auto values = m.model()->forward(micro.tensor("input_ids"), micro.tensor("attention_mask")).values;
    return (values.to(torch::kFloat) - 1).pow(2).mean();
  };
  return m.update(value_training_batch(), mini_batch_plan(value_training_spec(), nlohmann::json::object()), loss,
                  "critic/", metrics, "update_critic");
}

inline DataProto value_training_update(TrainableModel& m) {
  MetricAverager metrics;
  return value_training_update(m, metrics);
}

inline torch::Tensor value_training_parameters(TrainableModel& m) { return m.flat_parameters().tensor("parameters"); }

// Trains a model of `saved_spec` one update, checkpoints it into `dir`/ckpt and trains it once more; a model
// of `resumed_spec` (another seed) must come back from the checkpoint bit for bit and repeat that second
// update exactly. Returns the saved model for further checks.
inline std::unique_ptr<TrainableModel> expect_checkpoint_repeats_next_update(const ModelSpec& saved_spec,
                                                                             const ModelSpec& resumed_spec,
                                                                             const std::string& dir) {
  const std::string tok = dir + "/tokenizer.json";
  value_training_alphabet().save(tok);
  DataProto save, load;
  save.meta() = {{"dir", dir + "/ckpt"}, {"tokenizer", tok}};
  load.meta() = {{"dir", dir + "/ckpt"}};
  auto saved = value_training_model(saved_spec);
  value_training_update(*saved);  // the optimizer has state and a step count to restore
  saved->save_checkpoint(save);
  const torch::Tensor at_save = value_training_parameters(*saved);
  value_training_update(*saved);

  auto resumed = value_training_model(resumed_spec);
  EXPECT_FALSE(torch::equal(value_training_parameters(*resumed), at_save));
  resumed->load_checkpoint(load);
  EXPECT_TRUE(torch::equal(value_training_parameters(*resumed), at_save));
  value_training_update(*resumed);
  EXPECT_TRUE(torch::equal(value_training_parameters(*resumed), value_training_parameters(*saved)));
  return saved;
}

}  // namespace hybridflow::testing
