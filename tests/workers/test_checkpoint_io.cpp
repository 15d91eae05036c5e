// A trainable role's checkpoint on one process: the Hugging Face directory and the layout-free optimizer
// state (<role>_optim.safetensors) bring a fresh model and engine back to where the saved ones were, bit for
// bit, in fp32 and in bf16 (whose fp32 masters live in the optimizer file); a checkpoint from before the
// layout-free format (<role>_optim.pt) still loads, and so does a rank the saving run did not have; a file
// that is not an optimizer state is refused naming it.
#include "hybridflow/workers/checkpoint_io.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <set>

#include "hybridflow/core/fs.h"
#include "hybridflow/model/safetensors.h"
#include "hybridflow/model/tokenizer.h"
#include "hybridflow/workers/model_spec.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

using namespace hybridflow;

namespace {

const Tokenizer& tokenizer() {
  static const Tokenizer tok = Tokenizer::from_alphabet("0123456789+=");
  return tok;
}

CausalLM tiny_model(const std::string& dtype, int seed) {
  const nlohmann::json spec = {{"preset", "tiny"},         {"vocab_size", tokenizer().vocab_size()},
                               {"hidden_size", 32},        {"num_hidden_layers", 1},
                               {"num_attention_heads", 2}, {"num_key_value_heads", 1},
                               {"intermediate_size", 64},  {"init_seed", seed},
                               {"dtype", dtype}};
  return build_model(spec.get<ModelSpec>(), HeadKind::kLanguageModel);
}

OptimizerOptions options() {
  OptimizerOptions o;
  o.schedule.lr = 1e-2;
  return o;
}

StepStats step(CausalLM& model, TrainEngine& engine) {
  DataProto batch;
  batch.set_tensor("input_ids", torch::tensor({{1, 2, 3, 4}, {5, 6, 7, 8}}, torch::kLong));
  batch.set_tensor("attention_mask", torch::ones({2, 4}, torch::kLong));
  return engine.train_step(
      batch, 1,
      [&](const DataProto& m) {
        return model->forward(m.tensor("input_ids"), m.tensor("attention_mask")).logits.to(torch::kFloat).pow(2).mean();
      },
      "", LossWeighting::kRowMean);
}

void expect_same_parameters(CausalLM& a, CausalLM& b, const std::string& what) {
  const auto pa = a->named_parameters();
  const auto pb = b->named_parameters();
  for (const auto& item : pa) EXPECT_TRUE(torch::equal(item.value(), pb[item.key()])) << what << ": " << item.key();
}

// A model and its engine after `steps` steps, checkpointed into <dir>/ckpt as role "actor".
struct Saved {
  Saved(const hybridflow::testing::TempDir& dir, const std::string& dtype, int steps)
      : model(tiny_model(dtype, 1)), engine(model.ptr(), options()), ckpt(dir.file("ckpt")) {
    const std::string tok = dir.file("tokenizer.json");
    tokenizer().save(tok);
    for (int i = 0; i < steps; ++i) step(model, engine);
    save_role_checkpoint(ckpt, "actor", MeshCoord{}, model, engine, tok);
  }
  CausalLM model;
  TrainEngine engine;
  std::string ckpt;
};

// A model with other weights (all of them must come from the checkpoint) and a fresh engine.
struct Fresh {
  explicit Fresh(const std::string& dtype) : model(tiny_model(dtype, 2)), engine(model.ptr(), options()) {}
  CausalLM model;
  TrainEngine engine;
};

class CheckpointIo : public ::testing::TestWithParam<std::string> {};

TEST_P(CheckpointIo, AFreshModelAndEngineContinueBitForBit) {
  hybridflow::testing::TempDir dir;
  const std::string dtype = GetParam();
  Saved saved(dir, dtype, 2);

  const SafetensorsFile optim = read_safetensors(saved.ckpt + "/actor_optim.safetensors");
  EXPECT_EQ(optim.metadata.at("step"), "2");
  std::set<std::string> names;
  for (const auto& [name, tensor] : optim.tensors) names.insert(name);
  for (const auto& item : saved.model->named_parameters()) {
    for (const char* kind : {"exp_avg/", "exp_avg_sq/", "adam_step/"})
      EXPECT_TRUE(names.count(kind + item.key())) << kind << item.key();
    EXPECT_EQ(names.count("master/" + item.key()), dtype == "bf16" ? 1u : 0u) << item.key();
  }

  Fresh loaded(dtype);
  load_role_checkpoint(saved.ckpt, "actor", MeshCoord{}, loaded.model, loaded.engine);
  EXPECT_EQ(loaded.engine.step(), 2);
  expect_same_parameters(loaded.model, saved.model, "after loading");
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(step(loaded.model, loaded.engine).loss, step(saved.model, saved.engine).loss);
  expect_same_parameters(loaded.model, saved.model, "two steps later");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CheckpointIo, ::testing::Values("fp32", "bf16"));

TEST(CheckpointIoFormats, AnOptimizerFileOfTheEarlierFormatStillLoads) {
  hybridflow::testing::TempDir dir;
  Saved saved(dir, "fp32", 1);
  std::filesystem::remove(saved.ckpt + "/actor_optim.safetensors");
  saved.engine.save_state(saved.ckpt + "/actor_optim.pt");

  Fresh loaded("fp32");
  load_role_checkpoint(saved.ckpt, "actor", MeshCoord{}, loaded.model, loaded.engine);
  EXPECT_EQ(step(loaded.model, loaded.engine).loss, step(saved.model, saved.engine).loss);
  expect_same_parameters(loaded.model, saved.model, "a step after loading the .pt state");
}

TEST(CheckpointIoFormats, AFileThatIsNotAnOptimizerStateIsRefusedNamingIt) {
  hybridflow::testing::TempDir dir;
  Saved saved(dir, "fp32", 1);
  const std::string optim = saved.ckpt + "/actor_optim.safetensors";
  write_safetensors(optim, {{"weights", torch::zeros({2})}});
  auto load = [&] {
    return hybridflow::testing::error_of(
        [&] { load_role_checkpoint(saved.ckpt, "actor", MeshCoord{}, saved.model, saved.engine); });
  };
  std::string e = load();
  EXPECT_NE(e.find(optim), std::string::npos) << e;
  EXPECT_NE(e.find("not a hybridflow optimizer state"), std::string::npos) << e;

  std::filesystem::remove(optim);
  e = load();
  EXPECT_NE(e.find(optim + " is missing"), std::string::npos) << e;
}

// A run resumed on more processes than saved it: the new ranks have no RNG file and still load.
TEST(CheckpointIoFormats, ARankTheSavingRunDidNotHaveStillLoads) {
  hybridflow::testing::TempDir dir;
  Saved saved(dir, "fp32", 1);
  MeshCoord new_rank;
  new_rank.rank = 1;
  new_rank.world_size = 2;
  new_rank.dp = 1;
  new_rank.dp_size = 2;
  ASSERT_FALSE(file_exists(saved.ckpt + "/rng/actor_rank1.safetensors"));
  Fresh loaded("fp32");
  load_role_checkpoint(saved.ckpt, "actor", new_rank, loaded.model, loaded.engine);
  EXPECT_EQ(loaded.engine.step(), 1);
  expect_same_parameters(loaded.model, saved.model, "loaded by rank 1");
}

}  // namespace
