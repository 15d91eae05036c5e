// Bradley-Terry reward model training: the loss formula, that a tiny value-head model learns to rank a
// task's correct answers above corrupted ones on held-out prompts, and errors for bad pair files.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "hybridflow/core/error.h"
#include "hybridflow/core/jsonl.h"
#include "hybridflow/finetune/reward_model_training.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/tasks/dataset.h"
#include "hybridflow/tasks/task.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

CausalLM tiny_value_model(const Tokenizer& tok) {
  return testing::seeded_model(testing::tiny_model_config(tok, {.hidden_size = 64, .intermediate_size = 128}, "tiny"),
                               0, HeadKind::kValue);
}

TEST(RewardModelTraining, BradleyTerryLossMatchesTheFormula) {
  const std::vector<double> chosen = {1.5, -0.25, 0.0, 3.0};
  const std::vector<double> rejected = {0.5, 0.75, 0.0, -2.0};
  double expected = 0;
  for (size_t i = 0; i < chosen.size(); ++i) expected += std::log(1.0 + std::exp(-(chosen[i] - rejected[i])));
  expected /= static_cast<double>(chosen.size());
  auto loss = bradley_terry_loss(torch::tensor(chosen, torch::kDouble), torch::tensor(rejected, torch::kDouble));
  EXPECT_NEAR(loss.item<double>(), expected, 1e-12);
  // The gradient pushes the chosen score up and the rejected one down, by sigmoid(-(c - r)) / B.
  auto c = torch::tensor(chosen, torch::kDouble).requires_grad_(true);
  auto r = torch::tensor(rejected, torch::kDouble).requires_grad_(true);
  bradley_terry_loss(c, r).backward();
  for (size_t i = 0; i < chosen.size(); ++i) {
    const double g = 1.0 / (1.0 + std::exp(chosen[i] - rejected[i])) / static_cast<double>(chosen.size());
    EXPECT_NEAR(c.grad()[static_cast<int64_t>(i)].item<double>(), -g, 1e-12);
    EXPECT_NEAR(r.grad()[static_cast<int64_t>(i)].item<double>(), g, 1e-12);
  }
  EXPECT_THROW(bradley_terry_loss(torch::zeros({2}), torch::zeros({3})), Error);
}

TEST(RewardModelTraining, SequenceIsBosPromptResponseEos) {
  Tokenizer tok = Tokenizer::from_alphabet("0123456789+=");
  PromptEncoder prompts(tok, "", preference_prompt_options(/*apply_chat_template=*/false, /*add_bos=*/true));
  PreferenceRow row;
  row.prompt.prompt = "1+2=";
  row.chosen = "3";
  row.rejected = "4";
  const ScoredPair ids = reward_sequences(row, tok, prompts);
  auto expected = tok.encode("1+2=3", true);
  expected.push_back(tok.eos_id());
  EXPECT_EQ(ids.chosen, expected);
  expected = tok.encode("1+2=4", true);
  expected.push_back(tok.eos_id());
  EXPECT_EQ(ids.rejected, expected);
}

TEST(RewardModelTraining, TinyModelRanksHeldOutTaskPairs) {
  at::set_num_threads(1);
  testing::TempDir dir;
  TaskOptions task_options;
  // Two-letter reversal: 676 prompts, 200 of them held out. Telling "ba" from a one-letter corruption
  // needs the model to compare answer and prompt letters, not to memorise answers.
  task_options.min_length = 2;
  task_options.max_length = 2;
  auto task = make_task("reverse", task_options);
  auto splits = make_splits(*task, 476, 200, 5);
  std::vector<PreferencePair> train_pairs;  // several corruptions of each training prompt
  for (int k = 0; k < 8; ++k) {
    auto more = make_preference_pairs(*task, splits.train, 10 + k);
    train_pairs.insert(train_pairs.end(), more.begin(), more.end());
  }
  write_preference_jsonl(dir.file("train.jsonl"), train_pairs);
  write_preference_jsonl(dir.file("test.jsonl"), make_preference_pairs(*task, splits.test, 2));
  Tokenizer tok = Tokenizer::from_alphabet(task->alphabet());
  CausalLM model = tiny_value_model(tok);

  RewardModelOptions o;
  o.train_file = dir.file("train.jsonl");
  o.eval_file = dir.file("test.jsonl");
  o.lr = 2e-3;
  o.batch_size = 32;
  o.micro_batch_size = 32;
  o.steps = 300;
  o.warmup_steps = 10;
  o.eval_every = 100;
  o.out_dir = dir.file("out");
  const auto start = std::chrono::steady_clock::now();
  RewardModelResult r = train_reward_model(o, model, tok);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("held-out pairwise accuracy %.3f -> %.3f in %.1f s\n", r.initial_eval_accuracy, r.final_eval_accuracy,
              seconds);
  EXPECT_LT(r.initial_eval_accuracy, 0.75);
  EXPECT_GT(r.final_eval_accuracy, 0.9);
  EXPECT_LT(r.history.back().loss, r.history.front().loss);
  // Every sequence is bos + "xy=" + "yx" + eos: 7 tokens, two per pair.
  EXPECT_EQ(r.history.front().tokens, o.batch_size * 2 * 7);
  EXPECT_EQ(read_jsonl(dir.file("out/rm_metrics.jsonl")).size(), static_cast<size_t>(o.steps));
  // The public accuracy helper agrees with the one training reported.
  EXPECT_NEAR(pairwise_accuracy(model, tok, dir.file("test.jsonl")), r.final_eval_accuracy, 1e-9);
}

TEST(RewardModelTraining, MalformedPairFileNamesFileAndLine) {
  testing::TempDir dir;
  const std::string path = dir.file("pairs.jsonl");
  {
    std::ofstream f(path);
    f << R"({"prompt": "1+2=", "chosen": "3", "rejected": "4"})" << "\n";
    f << R"({"prompt": "2+2=", "chosen": "4"})" << "\n";
  }
  Tokenizer tok = Tokenizer::from_alphabet("0123456789+=");
  CausalLM model = tiny_value_model(tok);
  RewardModelOptions o;
  o.train_file = path;
  o.steps = 1;
  const std::string msg = testing::error_of([&] { train_reward_model(o, model, tok); });
  EXPECT_NE(msg.find(path + ":2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rejected"), std::string::npos) << msg;
}

// A pair is trained on whole: a prompt past the RL trainer's default 512-token prompt limit is no error here
// (neither command has data.max_prompt_length), and its tokens are all counted.
TEST(RewardModelTraining, LongPromptsAreTrainedWhole) {
  testing::TempDir dir;
  const std::string path = dir.file("pairs.jsonl");
  const std::string prompt(600, '1');
  std::ofstream(path) << R"({"prompt": ")" << prompt << R"(=", "chosen": "3", "rejected": "4"})" << "\n";
  Tokenizer tok = Tokenizer::from_alphabet("0123456789+=");
  CausalLM model = tiny_value_model(tok);
  RewardModelOptions o;
  o.train_file = path;
  o.steps = 1;
  o.batch_size = 1;
  o.micro_batch_size = 1;
  const RewardModelResult r = train_reward_model(o, model, tok);
  EXPECT_EQ(r.history.front().tokens, 2 * (1 + 601 + 1 + 1));  // bos, the prompt and "=", the answer, eos
}

TEST(RewardModelTraining, LanguageModelHeadIsRejected) {
  Tokenizer tok = Tokenizer::from_alphabet("0123456789+=");
  ModelConfig c = preset_model_config("tiny", tok.vocab_size());
  CausalLM lm(c);
  RewardModelOptions o;
  o.train_file = "unused.jsonl";
  EXPECT_NE(testing::error_of([&] { train_reward_model(o, lm, tok); }).find("value-head"), std::string::npos);
}

}  // namespace
}  // namespace hybridflow
