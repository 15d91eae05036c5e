// The `hybridflow` binary as a user runs it: exit codes, output and error messages.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/tiny_rl_config.h"

namespace {

using hybridflow::testing::CommandResult;
using hybridflow::testing::run_hybridflow;

TEST(Cli, InitThenInfoDescribesTheModel) {
  hybridflow::testing::TempDir dir;
  CommandResult init = run_hybridflow("init --preset tiny --task addition --seed 3 --out " + dir.file("m"));
  ASSERT_EQ(init.exit_code, 0) << init.output;
  CommandResult info = run_hybridflow("info " + dir.file("m"));
  ASSERT_EQ(info.exit_code, 0) << info.output;
  EXPECT_NE(info.output.find("LlamaForCausalLM"), std::string::npos) << info.output;
  EXPECT_NE(info.output.find("layers           4"), std::string::npos) << info.output;
}

TEST(Cli, InfoShowsWhatDistinguishesQwen3AndMistral) {
  hybridflow::testing::TempDir dir;
  ASSERT_EQ(run_hybridflow("init --preset qwen3-tiny --task addition --out " + dir.file("q")).exit_code, 0);
  ASSERT_EQ(run_hybridflow("init --preset mistral-tiny --task addition --out " + dir.file("m")).exit_code, 0);
  CommandResult qwen3 = run_hybridflow("info " + dir.file("q"));
  EXPECT_NE(qwen3.output.find("Qwen3ForCausalLM"), std::string::npos) << qwen3.output;
  EXPECT_NE(qwen3.output.find("(head_dim 48)"), std::string::npos) << qwen3.output;
  EXPECT_NE(qwen3.output.find("q/k head norms   yes"), std::string::npos) << qwen3.output;
  CommandResult mistral = run_hybridflow("info " + dir.file("m"));
  EXPECT_NE(mistral.output.find("MistralForCausalLM"), std::string::npos) << mistral.output;
  EXPECT_NE(mistral.output.find("sliding window   64"), std::string::npos) << mistral.output;
}

// The byte figure of a row ("  fp32 masters    2.2 GiB  note") of info's training-memory table.
std::string table_row(const std::string& output, const std::string& label) {
  const size_t at = output.find("\n  " + label + "  ");
  if (at == std::string::npos) return "no row " + label;
  const size_t start = output.find_first_not_of(' ', at + 3 + label.size());
  return output.substr(start, output.find("  ", start) - start);
}

TEST(Cli, InfoOfAPublishedPresetPrintsParametersWeightBytesAndTrainingMemory) {
  CommandResult info = run_hybridflow("info --preset qwen3-0.6b --batch 2 --seq 512");
  ASSERT_EQ(info.exit_code, 0) << info.output;
  for (const char* line :
       {"Qwen3ForCausalLM (qwen3)", "(head_dim 128)", "q/k head norms   yes",
        "parameters       596049920 (0.596 B): embedding 155582464 (embed_tokens), non-embedding 440467456",
        "weight bytes     fp32 2.2 GiB, bf16 1.1 GiB", "KV cache         112 KiB per token in bf16",
        "actor, bf16 weights, fp32 masters, micro-batch 2 x 512 tokens, tp 1, pp 1, ZeRO-1 over 1",
        "activations, checkpointed", "without activation checkpointing"})
    EXPECT_NE(info.output.find(line), std::string::npos) << line << "\n" << info.output;
  // bf16 weights 2 bytes a parameter, fp32 masters 4, Adam's two moments 8; logits 2 x 512 x 151936 x 8 bytes.
  EXPECT_EQ(table_row(info.output, "weights"), "1.1 GiB") << info.output;
  EXPECT_EQ(table_row(info.output, "fp32 masters"), "2.2 GiB") << info.output;
  EXPECT_EQ(table_row(info.output, "Adam moments"), "4.4 GiB") << info.output;
  EXPECT_EQ(table_row(info.output, "logits + gradient"), "1.2 GiB") << info.output;
  // ZeRO partitions Adam's moments; a critic has no logits and a value head instead of the tied lm_head.
  CommandResult sharded = run_hybridflow("info --preset qwen3-0.6b --zero 4 --role critic");
  ASSERT_EQ(sharded.exit_code, 0) << sharded.output;
  EXPECT_EQ(table_row(sharded.output, "Adam moments"), "1.1 GiB") << sharded.output;
  EXPECT_NE(sharded.output.find("none: a value head"), std::string::npos) << sharded.output;
  // A mixture of experts split over tensor-parallel ranks: the figures assume its experts fold over them, and
  // the note says what every rank holding every expert adds (Qwen3-30B-A3B at tp 2: half of its 28,991,029,248
  // expert parameters at 20 bytes each, 270 GiB).
  CommandResult moe = run_hybridflow("info --preset qwen3-30b-a3b --tp 2");
  ASSERT_EQ(moe.exit_code, 0) << moe.output;
  EXPECT_NE(moe.output.find("experts: as with expert_model_parallel_size = tp (2, Megatron's folding over the "
                            "tensor-parallel ranks); at 1 every tensor rank holds every expert: 270 GiB more"),
            std::string::npos)
      << moe.output;
  EXPECT_EQ(info.output.find("experts: as with"), std::string::npos) << "a dense model has no such note";
  CommandResult unknown = run_hybridflow("info --preset qwen9-1b");
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.output.find("qwen3-1.7b"), std::string::npos) << unknown.output;
}

TEST(Cli, InitAndBenchTakeThePresetTable) {
  hybridflow::testing::TempDir dir;
  CommandResult bench = run_hybridflow("bench machine --preset qwen2-tiny --vocab 96 --stream-mb 4 --batch 1 "
                                       "--prompt-length 4 --response-length 4");
  ASSERT_EQ(bench.exit_code, 0) << bench.output;
  EXPECT_NE(bench.output.find("(hidden 128, 4 layers, 4/2 heads, ffn 344, vocab 96)"), std::string::npos)
      << bench.output;
  CommandResult both = run_hybridflow("bench machine --preset qwen3-0.6b --model " + dir.file("none"));
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.output.find("give --preset or --model, not both"), std::string::npos) << both.output;
  CommandResult unknown = run_hybridflow("init --preset qwen3-7b --task addition --out " + dir.file("m"));
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.output.find("qwen3-0.6b, llama3.2-1b"), std::string::npos) << unknown.output;
  // `init --dtype bf16` writes a bfloat16 model that info reads back with its training memory.
  ASSERT_EQ(run_hybridflow("init --preset qwen3-tiny --task addition --dtype bf16 --out " + dir.file("q")).exit_code, 0);
  CommandResult info = run_hybridflow("info " + dir.file("q") + " --dtype fp32");
  ASSERT_EQ(info.exit_code, 0) << info.output;
  EXPECT_NE(info.output.find("dtype            bfloat16"), std::string::npos) << info.output;
  EXPECT_NE(info.output.find("actor, fp32 weights"), std::string::npos) << info.output;
  EXPECT_NE(info.output.find("weights          ok"), std::string::npos) << info.output;
}

TEST(Cli, InfoWithoutAModelDescribesTheBuildAndMachine) {
  CommandResult info = run_hybridflow("info");
  ASSERT_EQ(info.exit_code, 0) << info.output;
  EXPECT_NE(info.output.find("libtorch         2."), std::string::npos) << info.output;
  EXPECT_NE(info.output.find("bf16 matmul"), std::string::npos) << info.output;
  EXPECT_NE(info.output.find("gloo"), std::string::npos) << info.output;
}

TEST(Cli, GenerateSamplesReproduciblyWithASeed) {
  hybridflow::testing::TempDir dir;
  ASSERT_EQ(run_hybridflow("init --preset tiny --task addition --out " + dir.file("m")).exit_code, 0);
  std::string args = "generate " + dir.file("m") + " -p 1+2= -p 33+4= --max-new-tokens 5 --seed 7 -n 2";
  CommandResult a = run_hybridflow(args);
  CommandResult b = run_hybridflow(args);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
  // Two prompts x two samples: four lines, each starting with its prompt.
  EXPECT_EQ(std::count(a.output.begin(), a.output.end(), '\n'), 4) << a.output;
  EXPECT_EQ(a.output.rfind("1+2=", 0), 0u) << a.output;
}

TEST(Cli, UnknownConfigKeyNamesTheClosestValidKey) {
  CommandResult r = run_hybridflow("sft model.path=x optim.weight_decy=0.1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("optim.weight_decy"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("did you mean 'optim.weight_decay'"), std::string::npos) << r.output;
}

// The fine-tuning commands read AdamW's betas and eps; a value AdamW cannot take fails naming the key, before
// any data is generated.
TEST(Cli, FineTuningRefusesBadAdamArgumentsByName) {
  hybridflow::testing::TempDir dir;
  CommandResult betas = run_hybridflow("sft model.path=x optim.betas=[0.9] trainer.out_dir=" + dir.file("sft"));
  EXPECT_EQ(betas.exit_code, 1) << betas.output;
  EXPECT_NE(betas.output.find("optim.betas: expected [beta1, beta2], got 1 value(s)"), std::string::npos)
      << betas.output;
  EXPECT_FALSE(std::filesystem::exists(dir.file("sft/data")));
  CommandResult eps = run_hybridflow("dpo model.path=x optim.eps=0 trainer.out_dir=" + dir.file("dpo"));
  EXPECT_EQ(eps.exit_code, 1) << eps.output;
  EXPECT_NE(eps.output.find("optim.eps must be > 0"), std::string::npos) << eps.output;
}

TEST(Cli, CudaWithoutAGpuIsAClearErrorBeforeAnyWorkerStarts) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA device is visible: trainer.device=cuda is valid here";
  CommandResult r = run_hybridflow("train trainer.device=cuda trainer.total_steps=1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("trainer.device=cuda, but"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("trainer.device=cpu"), std::string::npos) << r.output;
  CommandResult bad = run_hybridflow("train trainer.device=tpu trainer.total_steps=1");
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("expected cpu | cuda | auto"), std::string::npos) << bad.output;
}

// Numbers that would make a run exit 0 having done nothing, or fail steps later, fail at start naming the key.
TEST(Cli, InvalidNumbersFailAtStartNamingTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"trainer.total_steps=-5", "trainer.total_steps must be > 0, got -5"},
      {"actor_rollout_ref.rollout.top_k=-2", "actor_rollout_ref.rollout.top_k must be >= 0"},
      {"actor_rollout_ref.rollout.top_p=0", "actor_rollout_ref.rollout.top_p must be in (0, 1]"},
      {"actor_rollout_ref.rollout.temperature=0", "actor_rollout_ref.rollout.temperature must be > 0"},
      {"actor_rollout_ref.actor.ppo_epochs=0", "actor_rollout_ref.actor.ppo_epochs must be > 0"},
  };
  for (const auto& [override_, message] : cases) {
    CommandResult r = run_hybridflow("train trainer.device=cpu " + override_);
    EXPECT_EQ(r.exit_code, 1) << override_ << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << override_ << "\n" << r.output;
  }
}

// verl writes top_k: -1 for "no top-k"; it runs as 0 (off) instead of failing at the first sample.
TEST(Cli, VerlsTopKMinusOneMeansOff) {
  std::string args = "train trainer.device=cpu actor_rollout_ref.rollout.top_k=-1";
  for (const auto& o : hybridflow::testing::tiny_rl_overrides("grpo", {"trainer.total_steps=1"})) args += " " + o;
  CommandResult r = run_hybridflow(args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(Cli, MissingModelDirectoryIsAClearError) {
  CommandResult r = run_hybridflow("info /nonexistent/model");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/model/config.json"), std::string::npos) << r.output;
}

TEST(Cli, UnknownTaskListsTheValidOnes) {
  hybridflow::testing::TempDir dir;
  CommandResult r = run_hybridflow("init --task multiplication --out " + dir.file("m"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("addition"), std::string::npos) << r.output;
}

}  // namespace
