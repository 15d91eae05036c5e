#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <random>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/jsonl.h"
#include "hybridflow/finetune/sft.h"
#include "hybridflow/model/pretrained.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

// Addition rows written by hand (the engine layer does not link the tasks layer).
void write_addition(const std::string& path, int rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> digit(0, 19);
  std::vector<nlohmann::json> out;
  for (int i = 0; i < rows; ++i) {
    int a = digit(rng), b = digit(rng);
    out.push_back({{"prompt", std::to_string(a) + "+" + std::to_string(b) + "="},
                   {"response", std::to_string(a + b)}});
  }
  write_jsonl(path, out);
}

struct TinySetup {
  Tokenizer tok = Tokenizer::from_alphabet("0123456789+=");
  CausalLM model =
      testing::seeded_model(testing::tiny_model_config(tok, {.hidden_size = 64, .intermediate_size = 128}, "tiny"), 0);
};

TEST(Sft, LossDropsAndCheckpointsLoad) {
  at::set_num_threads(1);
  testing::TempDir dir;
  write_addition(dir.file("train.jsonl"), 256, 1);
  write_addition(dir.file("test.jsonl"), 16, 2);
  TinySetup s;
  SftOptions o;
  o.train_file = dir.file("train.jsonl");
  o.eval_file = dir.file("test.jsonl");
  o.lr = 3e-3;
  o.batch_size = 32;
  o.micro_batch_size = 16;
  o.steps = 40;
  o.warmup_steps = 4;
  o.eval_every = 20;
  o.eval_samples = 8;
  o.save_every = 20;
  o.out_dir = dir.file("out");
  o.max_new_tokens = 4;
  int callbacks = 0;
  SftResult r = run_sft(o, s.model, s.tok, [&](const SftMetrics&) { ++callbacks; });

  ASSERT_EQ(r.history.size(), 40u);
  EXPECT_EQ(callbacks, 40);
  EXPECT_EQ(r.steps, 40);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    first += r.history[i].loss / 5;
    last += r.history[35 + i].loss / 5;
  }
  EXPECT_LT(last, 0.6 * first) << "first " << first << " last " << last;
  EXPECT_NEAR(r.history[0].lr, 3e-3 / 4, 1e-12);  // warm-up step 1 of 4
  EXPECT_LT(r.history[39].lr, r.history[10].lr);  // cosine decay
  EXPECT_GE(r.history[19].eval_accuracy, 0.0);
  EXPECT_LT(r.history[18].eval_accuracy, 0.0);  // not an eval step
  EXPECT_GE(r.final_eval_accuracy, 0.0);
  EXPECT_LE(r.final_eval_accuracy, 1.0);

  EXPECT_EQ(r.last_checkpoint, checkpoint_dir(o.out_dir, 40));
  EXPECT_TRUE(file_exists(checkpoint_dir(o.out_dir, 20) + "/config.json"));
  EXPECT_TRUE(file_exists(r.last_checkpoint + "/optimizer.pt"));
  EXPECT_FALSE(std::filesystem::exists(r.last_checkpoint + ".tmp"));
  EXPECT_EQ(read_jsonl(o.out_dir + "/sft_metrics.jsonl").size(), 40u);

  Pretrained loaded = load_pretrained(r.last_checkpoint);
  auto ids = torch::tensor({{1, 4, 5, 13, 6, 14}}, torch::kLong);
  auto mask = torch::ones_like(ids);
  torch::NoGradGuard ng;
  s.model->eval();
  loaded.model->eval();
  auto want = s.model->forward(ids, mask).logits;
  auto got = loaded.model->forward(ids, mask).logits;
  EXPECT_TRUE(torch::allclose(want, got, 1e-5, 1e-5));
}

TEST(Sft, BadDataNamesTheFile) {
  testing::TempDir dir;
  write_jsonl(dir.file("bad.jsonl"), {nlohmann::json{{"prompt", "1+1="}, {"response", "2x"}}});
  TinySetup s;
  SftOptions o;
  o.train_file = dir.file("bad.jsonl");
  o.steps = 1;
  try {
    run_sft(o, s.model, s.tok);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl"), std::string::npos) << e.what();
  }
}

// SFT reads verl's rows and encodes their chat messages exactly as the RL trainer will (the same
// PromptEncoder), so the fine-tuned model sees its RL prompts' tokens; the older rows keep bos + prompt.
TEST(Sft, VerlRowsEncodeThroughTheChatTemplateAsRLDoes) {
  testing::TempDir dir;
  const Tokenizer tok = Tokenizer::from_alphabet("0123456789+=?");
  // A template over the task's characters: the question, then "=" as the generation prompt.
  write_file_atomic(dir.file("tokenizer_config.json"),
                    R"({"chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %})"
                    R"({% if add_generation_prompt %}={% endif %}"})");
  write_jsonl(dir.file("verl.jsonl"),
              {nlohmann::json{{"prompt", {{{"role", "user"}, {"content", "12+34"}}}},
                              {"data_source", "addition"},
                              {"reward_model", {{"style", "rule"}, {"ground_truth", "46"}}}},
               nlohmann::json{{"prompt", "7+1="}, {"answer", "8"}}});
  PromptEncoder prompts(tok, dir.path(), PromptOptions{});
  const auto examples = read_sft_examples(dir.file("verl.jsonl"), tok, prompts);
  ASSERT_EQ(examples.size(), 2u);
  EXPECT_EQ(examples[0].prompt, tok.encode("12+34=", /*add_bos=*/false));  // the template's text, no second bos
  EXPECT_EQ(examples[0].prompt_text, "12+34=");
  std::vector<int64_t> target = tok.encode("46");
  target.push_back(tok.eos_id());
  EXPECT_EQ(examples[0].response, target);
  EXPECT_EQ(examples[1].prompt, tok.encode("7+1=", /*add_bos=*/true));  // a plain string, as before

  // A row without a target.
  write_jsonl(dir.file("no_target.jsonl"), {nlohmann::json{{"prompt", {{{"role", "user"}, {"content", "1+1"}}}}}});
  try {
    read_sft_examples(dir.file("no_target.jsonl"), tok, prompts);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no_target.jsonl:1: no target to train on"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hybridflow
