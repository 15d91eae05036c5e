// Ulysses sequence parallelism (parallel/sequence_parallel.h): a model whose layers run over a slice of the
// sequence per rank, with all-to-alls around attention, gives the log-probs and values of one process within
// 1e-5 and its (averaged over the group) gradients within 1e-4, at 2 and 4 ranks, for grouped-query attention
// with 2 query heads per KV head, for Qwen3's q/k norms, for a sequence length that does not divide by the
// group, and with activation checkpointing; KV head counts the group does not divide are refused naming the
// key. Combined with tensor parallelism (the group splits each tensor-parallel rank's heads, repeating a KV head
// where a rank holds fewer than the group) and with pipeline stages (a stage passes its slice on), it gives
// one process's outputs and gradients too. Every rank runs in a forked process over Gloo.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <tuple>
#include <utility>

#include "engine/tensor_parallel_fixture.h"
#include "hybridflow/parallel/device_mesh.h"
#include "parallel/rank_processes.h"

namespace hybridflow {
namespace {

// Gradients summed over positions: the ranks' partial sums add in another order than one process's, and CPUs'
// GEMM kernels differ in theirs (an AVX-only AMD EPYC's embedding gradients differed by 7.6e-5 where an AVX-512
// Xeon's stayed under 1e-5).
constexpr double kGradTolerance = 1e-4;

using namespace hybridflow::testing;

// 8 query heads over 4 KV heads: both divide by 2 and by 4.
ModelConfig ulysses_llama_config() {
  ModelConfig c = tiny_model_config({.vocab_size = 64, .hidden_size = 32, .num_attention_heads = 8,
                                     .num_key_value_heads = 4, .max_position_embeddings = 128});
  c.attention_bias = true;
  return c;
}

ModelConfig ulysses_qwen3_config() {
  ModelConfig c = ulysses_llama_config();
  c.architecture = "Qwen3ForCausalLM";
  c.model_type = "qwen3";
  c.explicit_head_dim = 12;
  return c;
}

void average_grads_over(CausalLMImpl& model, Communicator& comm) {
  for (auto& p : model.parameters())
    if (p.grad().defined()) comm.all_reduce(p.mutable_grad(), ReduceOp::kAvg);
}

// Zeros where a parameter got no gradient (the head, when only hidden states enter the loss).
std::map<std::string, torch::Tensor> grads_of(CausalLMImpl& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model.named_parameters()) {
    out[item.key()] = item.value().grad().defined() ? item.value().grad().clone() : torch::zeros_like(item.value());
  }
  return out;
}

void expect_close(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-5)) << what << " differ by " << (got - want).abs().max().item<double>();
}

// The log-probs and entropy of rl_batch()'s response tokens, from the whole logits.
std::pair<torch::Tensor, torch::Tensor> response_token_log_probs(CausalLM& model, const DataProto& batch) {
  const auto& ids = batch.tensor("input_ids");
  auto logits = model->forward(ids, batch.tensor("attention_mask")).logits.narrow(1, kPromptLen - 1, kResponseLen);
  auto log_softmax = torch::log_softmax(logits, -1);
  auto picked = log_softmax.gather(-1, ids.narrow(1, kPromptLen, kResponseLen).unsqueeze(-1)).squeeze(-1);
  return {picked, -(log_softmax.exp() * log_softmax).sum(-1)};
}

// PPO's clipped surrogate with an entropy bonus.
torch::Tensor surrogate_loss(CausalLM& model, const DataProto& m, torch::Tensor* log_probs, torch::Tensor* entropy) {
  std::tie(*log_probs, *entropy) = response_token_log_probs(model, m);
  auto ratio = torch::exp(*log_probs - m.tensor("old_log_probs"));
  const auto& adv = m.tensor("advantages");
  auto surrogate = -torch::min(ratio * adv, torch::clamp(ratio, 0.8, 1.2) * adv);
  return masked_token_mean(surrogate - 0.01 * *entropy, m.tensor("loss_mask"));
}

// Policy log-probs and entropy, then values, then hidden states of a length the group does not divide.
void check_sequence_parallel(const ModelConfig& config, int sp_size, bool checkpointing) {
  run_ranks(
      sp_size,
      [&](int rank, int port) {
        Communicator comm(gloo_world(rank, sp_size, port));
        const SequenceParallelGroup sp(&comm);
        const DataProto batch = rl_batch();
        for (HeadKind head : {HeadKind::kLanguageModel, HeadKind::kValue}) {
          CausalLM whole = reference_model(head, 1234, config);
          CausalLM split = reference_model(head, 1234, config);
          split->set_sequence_parallel(sp);
          split->set_gradient_checkpointing(checkpointing);
          const bool policy = head == HeadKind::kLanguageModel;
          if (policy) {
            torch::Tensor want_lp, want_entropy, got_lp, got_entropy;
            surrogate_loss(whole, batch, &want_lp, &want_entropy).backward();
            surrogate_loss(split, batch, &got_lp, &got_entropy).backward();
            expect_close(got_lp, want_lp, "log-probs");
            expect_close(got_entropy, want_entropy, "entropy");
          } else {
            auto want = whole->forward(batch.tensor("input_ids"), batch.tensor("attention_mask")).values;
            auto got = split->forward(batch.tensor("input_ids"), batch.tensor("attention_mask")).values;
            expect_close(got, want, "values");
            value_loss(whole, batch).backward();
            value_loss(split, batch).backward();
          }
          average_grads_over(*split, comm);
          expect_same_tensors(grads_of(*split), grads_of(*whole), kGradTolerance,
                              policy ? "policy gradients" : "value gradients");
        }
        // 7 positions: padded to a multiple of the group inside the model, cut back after the gather.
        CausalLM whole = reference_model(HeadKind::kLanguageModel, 1234, config);
        CausalLM split = reference_model(HeadKind::kLanguageModel, 1234, config);
        split->set_sequence_parallel(sp);
        auto ids = batch.tensor("input_ids").narrow(1, 0, 7);
        auto mask = batch.tensor("attention_mask").narrow(1, 0, 7);
        // A padding position that sees no key (row 1's first) averages over every value: over 8 there, 7 here.
        // Only real tokens' hidden states are defined.
        const auto real = mask.unsqueeze(-1).to(torch::kFloat);
        auto want = whole->hidden_states(ids, mask) * real;
        auto got = split->hidden_states(ids, mask) * real;
        expect_close(got, want, "hidden states of 7 positions");
        torch::manual_seed(3);
        auto weights = torch::randn(want.sizes());
        (want * weights).sum().backward();
        (got * weights).sum().backward();
        average_grads_over(*split, comm);
        expect_same_tensors(grads_of(*split), grads_of(*whole), kGradTolerance, "gradients at 7 positions");
      },
      120);
}

TEST(SequenceParallel, LlamaOverTwoAndFourRanksEqualsOneProcess) {
  for (int sp : {2, 4}) check_sequence_parallel(ulysses_llama_config(), sp, /*checkpointing=*/false);
}

TEST(SequenceParallel, Qwen3WithActivationCheckpointingOverTwoAndFourRanksEqualsOneProcess) {
  for (int sp : {2, 4}) check_sequence_parallel(ulysses_qwen3_config(), sp, /*checkpointing=*/true);
}

// 4 ranks: tensor-parallel pairs {0, 1}, {2, 3}, sequence-parallel pairs {0, 2}, {1, 3} (one tensor rank each).
// With 4 query heads over 2 KV heads a tensor-parallel rank holds 2 query heads and 1 KV head, which the
// sequence-parallel pair shares by repeating it; with 8 over 4, 4 and 2, which split.
void check_sequence_with_tensor_parallel(const ModelConfig& config) {
  run_ranks(
      4,
      [&](int rank, int port) {
        ProcessGroup world = gloo_world(rank, 4, port);
        const DeviceMesh mesh(1, 2, 2);
        Communicator tp(world.split(mesh.tp_groups()));
        Communicator sp_comm(world.split(mesh.dp_groups()));
        const DataProto batch = rl_batch();
        for (HeadKind head : {HeadKind::kLanguageModel, HeadKind::kValue}) {
          CausalLM whole = reference_model(head, 1234, config);
          CausalLM split(config, head, TensorParallelGroup(&tp));
          load_full_state(*split, parameters_of(*whole));
          split->set_sequence_parallel(SequenceParallelGroup(&sp_comm));
          const bool policy = head == HeadKind::kLanguageModel;
          const auto& ids = batch.tensor("input_ids");
          const auto& mask = batch.tensor("attention_mask");
          if (policy) {
            // The vocabulary-parallel head's logits, gathered over the tensor-parallel pair.
            {
              torch::NoGradGuard no_grad;
              expect_close(tp.all_gather_cat(split->forward(ids, mask).logits.contiguous(), 2),
                           whole->forward(ids, mask).logits, "logits");
            }
            // Gradients through every layer: a loss on the final hidden states (whole on every rank).
            const auto real = mask.unsqueeze(-1).to(torch::kFloat);
            torch::manual_seed(3);
            auto weights = torch::randn({ids.size(0), ids.size(1), config.hidden_size});
            auto want = whole->hidden_states(ids, mask) * real;
            auto got = split->hidden_states(ids, mask) * real;
            expect_close(got, want, "hidden states");
            (want * weights).sum().backward();
            (got * weights).sum().backward();
          } else {
            expect_close(split->forward(ids, mask).values, whole->forward(ids, mask).values, "values");
            value_loss(whole, batch).backward();
            value_loss(split, batch).backward();
          }
          average_grads_over(*split, sp_comm);
          expect_same_tensors(gather_full_grads(*split), grads_of(*whole), kGradTolerance,
                              policy ? "gradients through the hidden states" : "value gradients");
        }
      },
      120);
}

TEST(SequenceParallel, WithTensorParallelismEqualsOneProcess) {
  ModelConfig shared_kv = ulysses_qwen3_config();  // q/k norms see a rank's heads
  shared_kv.num_attention_heads = 4;
  shared_kv.num_key_value_heads = 2;
  check_sequence_with_tensor_parallel(shared_kv);
  check_sequence_with_tensor_parallel(ulysses_llama_config());
}

// 4 ranks: pipeline stages of 2 layers each, sequence-parallel pairs {0, 1} (stage 0) and {2, 3} (stage 1);
// rank r of a pair sends its slice to rank r of the next stage. A loss on the last stage's hidden states of 8
// positions, and of 7 (padded to 8 inside the model, so the stages pass slices of 4).
TEST(SequenceParallel, WithPipelineStagesEqualsOneProcess) {
  run_ranks(
      4,
      [](int rank, int port) {
        ProcessGroup world = gloo_world(rank, 4, port);
        const DeviceMesh mesh(2, 2, 1);
        Communicator stages(world.split(mesh.pp_groups()));
        Communicator sp_comm(world.split(mesh.dp_groups()));
        ModelConfig config = ulysses_qwen3_config();
        config.num_hidden_layers = 4;
        const int stage = mesh.coords(rank).pp;
        const DataProto batch = rl_batch();
        for (int64_t len : {8, 7}) {
          const std::string what = std::to_string(len) + " positions";
          CausalLM whole = reference_model(HeadKind::kLanguageModel, 1234, config);
          CausalLM split(config, HeadKind::kLanguageModel, TensorParallelGroup{}, PipelineStage{stage, 2});
          load_full_state(*split, parameters_of(*whole));
          split->set_sequence_parallel(SequenceParallelGroup(&sp_comm));
          auto ids = batch.tensor("input_ids").narrow(1, 0, len);
          auto mask = batch.tensor("attention_mask").narrow(1, 0, len);
          const auto real = mask.unsqueeze(-1).to(torch::kFloat);
          torch::manual_seed(3);
          auto weights = torch::randn({ids.size(0), len, config.hidden_size});
          auto want = whole->hidden_states(ids, mask) * real;
          (want * weights).sum().backward();
          if (stage == 0) {
            auto h = split->hidden_states(ids, mask);
            EXPECT_EQ(h.size(1), 4) << what << ": stage 0 passes a slice of the padded sequence";
            stages.isend(h.detach(), 1).wait();
            torch::Tensor grad = torch::empty_like(h);
            stages.recv(grad, 1);
            h.backward(grad);
          } else {
            torch::Tensor input = split->stage_activation_like(ids.size(0), len);
            stages.recv(input, 0);
            input.set_requires_grad(true);
            split->set_stage_input(input);
            auto got = split->hidden_states(ids, mask) * real;
            expect_close(got, want, what + ": hidden states");
            (got * weights).sum().backward();
            stages.isend(input.grad(), 0).wait();
          }
          average_grads_over(*split, sp_comm);
          // Each stage's parameters against the same names of the whole model.
          const auto whole_grads = grads_of(*whole);
          for (const auto& [name, grad] : grads_of(*split)) {
            ASSERT_TRUE(whole_grads.count(name)) << name;
            EXPECT_TRUE(torch::allclose(grad, whole_grads.at(name), kGradTolerance, kGradTolerance))
                << what << ": " << name << " differs by " << (grad - whole_grads.at(name)).abs().max().item<double>();
          }
        }
      },
      120);
}

TEST(SequenceParallel, AllToAllRoundTripsAndSplitsHeads) {
  run_ranks(2, [](int rank, int port) {
    Communicator comm(gloo_world(rank, 2, port));
    const SequenceParallelGroup sp(&comm);
    // Position p of head h holds 100 p + h: the whole [1, 4, 4, 1] sequence, rank r holds positions 2r, 2r + 1.
    auto whole = (torch::arange(4).view({1, 4, 1, 1}) * 100 + torch::arange(4).view({1, 1, 4, 1})).to(torch::kFloat);
    auto mine = whole.narrow(1, 2 * rank, 2);
    auto heads = sequence_to_head_split(mine, sp);
    EXPECT_TRUE(torch::equal(heads, whole.narrow(2, 2 * rank, 2))) << heads;
    EXPECT_TRUE(torch::equal(head_to_sequence_split(heads, sp), mine));
    EXPECT_EQ(comm.stats().of("all_to_all").calls, 2);
  });
}

TEST(SequenceParallel, HeadsTheGroupDoesNotSplitAreRefusedNamingTheKey) {
  run_ranks(4, [](int rank, int port) {
    Communicator comm(gloo_world(rank, 4, port));
    ModelConfig config = ulysses_llama_config();
    // The query heads split 4 ways, but 3 KV heads neither split over 4 ranks nor repeat onto them evenly.
    config.num_attention_heads = 12;
    config.num_key_value_heads = 3;
    config.hidden_size = 48;
    CausalLM model(config);
    try {
      model->set_sequence_parallel(SequenceParallelGroup(&comm));
      ADD_FAILURE() << "4 ranks over 12 query and 3 KV heads were accepted";
    } catch (const std::exception& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("ulysses_sequence_parallel_size 4"), std::string::npos) << message;
      EXPECT_NE(message.find("num_key_value_heads = 3"), std::string::npos) << message;
      EXPECT_NE(message.find("num_attention_heads = 12"), std::string::npos) << message;
    }
  });
}

}  // namespace
}  // namespace hybridflow
