// A Hugging Face directory loads straight into a tensor-parallel layout (each rank copies its slices out of
// the memory-mapped safetensors) and a tensor-parallel model saves back to one directory, identical to what
// one process writes. Everything torch runs in forked ranks, so the parent's thread pools stay unused.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "engine/tensor_parallel_fixture.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/model/safetensors.h"
#include "parallel/rank_processes.h"
#include "support/temp_dir.h"

namespace hybridflow {
namespace {

using namespace hybridflow::testing;

std::map<std::string, torch::Tensor> file_tensors(const std::string& path) {
  auto file = read_safetensors(path);
  return {file.tensors.begin(), file.tensors.end()};
}

TEST(TensorParallelCheckpoint, LoadsIntoTwoAndFourRanksAndSavesOneDirectory) {
  TempDir dir;
  const std::string original = dir.file("original"), saved = dir.file("saved");
  run_ranks(1, [&](int, int) {
    save_pretrained(original, reference_model(HeadKind::kLanguageModel), Tokenizer::from_alphabet("abcdefgh"));
  });
  for (int tp_size : {2, 4}) {
    run_ranks(
        tp_size,
        [&](int rank, int port) {
          Communicator tp(gloo_world(rank, tp_size, port));
          Pretrained split = load_pretrained(original, HeadKind::kLanguageModel, torch::kFloat32, TensorParallelGroup(&tp));
          const auto want = file_tensors(original + "/model.safetensors");
          expect_same_tensors(gather_full_state(*split.model), want, 0.0, "loaded shards");
          // A rank holds 1/t of the split weights only.
          EXPECT_EQ(split.model->named_parameters()["model.embed_tokens.weight"].size(0), 64 / tp_size);

          Pretrained whole = load_pretrained(original);
          const DataProto batch = rl_batch();
          torch::NoGradGuard no_grad;
          auto hidden = split.model->hidden_states(batch.tensor("input_ids"), batch.tensor("attention_mask"));
          auto full = whole.model->forward(batch.tensor("input_ids"), batch.tensor("attention_mask")).logits;
          auto gathered = split.model->full_vocab_logits(hidden);
          EXPECT_TRUE(torch::allclose(gathered, full, 1e-5, 1e-5)) << (gathered - full).abs().max();

          const std::string out = saved + std::to_string(tp_size);
          save_pretrained(out, split.model, split.tokenizer);
          tp.barrier();
          expect_same_tensors(file_tensors(out + "/model.safetensors"), want, 0.0, "saved directory");
          EXPECT_EQ(load_model_config(out + "/config.json").num_attention_heads, 4);
        },
        60);
  }
}

}  // namespace
}  // namespace hybridflow
