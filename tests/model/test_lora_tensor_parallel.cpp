// LoRA adapters under tensor parallelism (model/lora_branch.h): with 2 and 4 ranks (k/v_proj split at 2,
// replicated at 4) a split model draws the adapters one process draws, and its logits and adapter gradients
// equal one process's; merge/unmerge, and PEFT's files saved and loaded, work on the slices. Every rank runs
// in a forked process over Gloo.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <string>

#include "engine/tensor_parallel_fixture.h"
#include "hybridflow/model/lora.h"
#include "hybridflow/model/safetensors.h"
#include "parallel/rank_processes.h"
#include "support/temp_dir.h"

namespace hybridflow {
namespace {

using namespace hybridflow::testing;

std::map<std::string, torch::Tensor> lora_only(const std::map<std::string, torch::Tensor>& tensors) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, t] : tensors)
    if (is_lora_parameter_name(name)) out.emplace(name, t);
  return out;
}

LoraConfig tp_lora_config() {
  LoraConfig lora;
  lora.rank = 4;
  lora.alpha = 12;
  return lora;
}

// The same non-zero adapters in every process (a fresh B is zeros, which would hide a wrong split of B).
void randomize_tp_adapters(CausalLM& model) {
  torch::manual_seed(7);
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters())
    if (is_lora_parameter_name(item.key()))
      item.value().copy_(torch::randn(item.value().sizes()) / std::sqrt(static_cast<double>(item.value().size(1))));
}

torch::Tensor split_logits(CausalLM& model, const DataProto& batch) {
  return model->full_vocab_logits(model->hidden_states(batch.tensor("input_ids"), batch.tensor("attention_mask")));
}

// A loss that weighs every logit differently, so every adapter gets a gradient of its own.
torch::Tensor weighted_logit_loss(const torch::Tensor& logits) {
  torch::manual_seed(11);
  return (logits * torch::randn(logits.sizes())).mean();
}

void check_lora_layout(const ModelConfig& config, int tp_size, const std::string& dir) {
  run_ranks(
      tp_size,
      [&](int rank, int port) {
        Communicator comm(gloo_world(rank, tp_size, port));
        const TensorParallelGroup tp(&comm);
        CausalLM whole = reference_model(HeadKind::kLanguageModel, 1234, config);
        whole->add_lora(tp_lora_config(), /*seed=*/5);
        CausalLM split(config, HeadKind::kLanguageModel, tp);
        split->add_lora(tp_lora_config(), /*seed=*/5);
        expect_same_tensors(lora_only(gather_full_state(*split)), lora_only(parameters_of(*whole)), 0.0,
                            "fresh adapters");

        randomize_tp_adapters(whole);
        load_full_state(*split, parameters_of(*whole));
        const DataProto batch = rl_batch();
        auto want_logits = whole->forward(batch.tensor("input_ids"), batch.tensor("attention_mask")).logits;
        auto got_logits = split_logits(split, batch);
        EXPECT_TRUE(torch::allclose(got_logits, want_logits, 1e-5, 1e-5))
            << "logits differ by " << (got_logits - want_logits).abs().max().item<double>();
        weighted_logit_loss(want_logits).backward();
        weighted_logit_loss(got_logits).backward();
        for (const auto& item : split->named_parameters()) {
          if (!is_lora_parameter_name(item.key())) {
            EXPECT_FALSE(item.value().grad().defined()) << item.key();
          }
        }
        const auto want_grads = lora_only(gather_full_grads(*whole));
        expect_same_tensors(lora_only(gather_full_grads(*split)), want_grads, 1e-5, "adapter gradients");
        for (const auto& [name, g] : want_grads) ASSERT_GT(g.abs().max().item<double>(), 0.0) << name;

        torch::NoGradGuard no_grad;
        const auto before = parameters_of(*split);
        split->merge_lora();
        auto merged_logits = split_logits(split, batch);
        EXPECT_TRUE(torch::allclose(merged_logits, want_logits, 1e-5, 1e-5))
            << "merged logits differ by " << (merged_logits - want_logits).abs().max().item<double>();
        split->unmerge_lora();
        expect_same_tensors(parameters_of(*split), before, 0.0, "unmerged weights");

        // PEFT's file holds the whole tensors, written by rank 0; each rank loads its slices of it.
        const std::string adapter = dir + "/tp" + std::to_string(tp_size);
        save_lora_adapter(adapter, split, "base");
        comm.barrier();
        auto file = read_safetensors(adapter + "/adapter_model.safetensors");
        std::map<std::string, torch::Tensor> saved;
        for (const auto& [name, t] : file.tensors) saved.emplace(name.substr(std::string("base_model.model.").size()), t);
        expect_same_tensors(saved, lora_only(parameters_of(*whole)), 0.0, "saved adapter");
        CausalLM fresh(config, HeadKind::kLanguageModel, tp);
        {
          std::map<std::string, torch::Tensor> base;
          for (const auto& [name, t] : parameters_of(*whole))
            if (!is_lora_parameter_name(name)) base.emplace(name, t);
          load_full_state(*fresh, base);
        }
        load_lora_adapter(adapter, fresh);
        EXPECT_TRUE(torch::equal(split_logits(fresh, batch), split_logits(split, batch)));
        comm.barrier();
      },
      120);
}

TEST(LoraTensorParallel, LlamaSplitOverTwoAndFourRanksEqualsOneProcess) {
  TempDir dir;
  for (int tp_size : {2, 4}) check_lora_layout(tensor_parallel_test_config(), tp_size, dir.path());
}

TEST(LoraTensorParallel, Qwen3SplitOverTwoAndFourRanksEqualsOneProcess) {
  TempDir dir;
  for (int tp_size : {2, 4}) check_lora_layout(qwen3_tensor_parallel_test_config(), tp_size, dir.path());
}

}  // namespace
}  // namespace hybridflow
