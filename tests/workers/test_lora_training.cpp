// A training role's model with LoRA (the model spec's lora keys) on one process, in fp32 and bf16: only the
// adapters (and a value head) train, so the base weights stay bit for bit as built and the optimizer holds
// moments (and bf16's fp32 masters) for the adapters alone; a checkpoint holds the base model as a Hugging
// Face directory and the adapters beside it in PEFT's format, and resuming from it repeats the next update
// bit for bit; lora_adapter_path starts a model from such a directory; bad LoRA settings name their key.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "hybridflow/core/fs.h"
#include "hybridflow/model/lora.h"
#include "hybridflow/model/safetensors.h"
#include "hybridflow/workers/model_spec.h"
#include "hybridflow/workers/trainable_model.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "workers/value_training_fixture.h"

using namespace hybridflow;

namespace {

using hybridflow::testing::value_training_model;
using hybridflow::testing::value_training_parameters;
using hybridflow::testing::value_training_update;

// A one-layer model of the tiny preset with rank-4 adapters on every projection.
ModelSpec lora_spec(const std::string& dtype, uint64_t seed) {
  ModelSpec s = hybridflow::testing::value_training_model_spec(dtype, seed);
  s.lora.rank = 4;
  s.lora.alpha = 8;
  s.lora_key = "critic.model";
  return s;
}

std::map<std::string, torch::Tensor> named(const CausalLM& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model->named_parameters()) out.emplace(item.key(), item.value().detach().clone());
  return out;
}


class LoraTraining : public ::testing::TestWithParam<std::string> {};

TEST_P(LoraTraining, OnlyTheAdaptersAndTheValueHeadTrainAndHoldOptimizerState) {
  const ModelSpec spec = lora_spec(GetParam(), 1);
  auto m = value_training_model(spec);
  const auto before = named(m->model());
  value_training_update(*m);
  const DataProto out = value_training_update(*m);
  const auto after = named(m->model());

  int64_t trained_numel = 0;
  for (const auto& [name, tensor] : after) {
    const bool trains = is_lora_parameter_name(name) || name == "score.weight";
    EXPECT_EQ(m->model()->named_parameters()[name].requires_grad(), trains) << name;
    if (trains) {
      trained_numel += tensor.numel();
      // B starts at zero and A moves with it; the head regresses toward 1.
      EXPECT_FALSE(torch::equal(before.at(name), tensor)) << name << " did not train";
    } else {
      EXPECT_TRUE(torch::equal(before.at(name), tensor)) << name << " (a base weight) changed";
    }
  }
  // The base weights are also exactly those of the model built without adapters.
  ModelSpec plain = spec;
  plain.lora = LoraConfig{};
  for (const auto& [name, tensor] : named(build_model(plain, HeadKind::kValue))) {
    if (name != "score.weight") {
      EXPECT_TRUE(torch::equal(after.at(name), tensor)) << name;
    }
  }

  // Adam's two moments and, for bf16 weights, an fp32 master: of the trained tensors only.
  const int64_t copies = GetParam() == "bf16" ? 3 : 2;
  EXPECT_EQ(out.meta().at("metrics").at("critic/optimizer_state_bytes").get<double>(),
            static_cast<double>(copies * trained_numel * 4));
}

TEST_P(LoraTraining, CheckpointHoldsPeftAdaptersAndRepeatsTheNextUpdateBitForBit) {
  hybridflow::testing::TempDir dir;
  // Another seed for the resumed model: other base weights, adapters and head, all restored.
  auto saved = hybridflow::testing::expect_checkpoint_repeats_next_update(lora_spec(GetParam(), 1),
                                                                          lora_spec(GetParam(), 2), dir.path());
  // The Hugging Face directory holds the base model; the adapters are PEFT's files beside it.
  const std::string adapter = dir.file("ckpt/critic/lora_adapter");
  EXPECT_TRUE(file_exists(adapter + "/adapter_config.json"));
  for (const auto& [name, tensor] : read_safetensors(dir.file("ckpt/critic/model.safetensors")).tensors)
    EXPECT_FALSE(is_lora_parameter_name(name)) << name;
  std::set<std::string> moments;  // the optimizer state's parameters
  for (const auto& [name, tensor] : read_safetensors(dir.file("ckpt/critic_optim.safetensors")).tensors)
    if (name.rfind("exp_avg/", 0) == 0) moments.insert(name.substr(8));
  std::set<std::string> trained;
  for (const auto& item : saved->model()->named_parameters())
    if (item.value().requires_grad()) trained.insert(item.key());
  EXPECT_EQ(moments, trained);
  EXPECT_EQ(read_lora_adapter_tensors(adapter).size(), 14u);  // A and B of 7 projections
}

TEST_P(LoraTraining, AnAdapterDirectoryStartsTheAdapters) {
  hybridflow::testing::TempDir dir;
  auto trained = value_training_model(lora_spec(GetParam(), 1));
  value_training_update(*trained);
  DataProto save;
  save.meta() = {{"dir", dir.file("adapter")}, {"base", "tiny"}};
  trained->save_lora_adapter(save);

  ModelSpec from_dir = lora_spec(GetParam(), 1);
  from_dir.lora = LoraConfig{};  // the directory's adapter_config.json says what to add
  from_dir.lora_adapter_path = dir.file("adapter");
  auto started = value_training_model(from_dir);
  EXPECT_EQ(started->model()->lora_config().rank, 4);
  const auto want = named(trained->model());
  for (const auto& [name, tensor] : named(started->model())) {
    if (is_lora_parameter_name(name)) {
      EXPECT_TRUE(torch::equal(tensor, want.at(name))) << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LoraTraining, ::testing::Values("fp32", "bf16"));

TEST(LoraTrainingErrors, BadSettingsNameTheirKey) {
  using hybridflow::testing::error_of;
  ModelSpec unknown = lora_spec("fp32", 1);
  unknown.lora.target_modules = {"qkv_proj"};
  EXPECT_NE(error_of([&] { build_model(unknown, HeadKind::kValue); }).find("critic.model.target_modules"),
            std::string::npos);
  ModelSpec wide = lora_spec("fp32", 1);
  wide.lora.rank = 1000;
  EXPECT_NE(error_of([&] { build_model(wide, HeadKind::kValue); }).find("critic.model.lora_rank 1000 is larger"),
            std::string::npos);
  ModelSpec missing = lora_spec("fp32", 1);
  missing.lora_adapter_path = "/nonexistent/adapter";
  EXPECT_NE(error_of([&] { build_model(missing, HeadKind::kValue); }).find("critic.model.lora_adapter_path"),
            std::string::npos);

  // An adapter of a wider model does not fit: the error names the key and the tensor.
  hybridflow::testing::TempDir dir;
  ModelSpec wider = lora_spec("fp32", 1);
  wider.hidden_size = 256;
  save_lora_adapter(dir.file("wide"), build_model(wider, HeadKind::kLanguageModel), "wider");
  ModelSpec other = lora_spec("fp32", 1);
  other.lora_adapter_path = dir.file("wide");
  const std::string error = error_of([&] { build_model(other, HeadKind::kLanguageModel); });
  EXPECT_NE(error.find("critic.model.lora_adapter_path"), std::string::npos) << error;
  EXPECT_NE(error.find("has shape"), std::string::npos) << error;
}

}  // namespace
