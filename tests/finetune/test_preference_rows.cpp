// TRL's preference formats as `hybridflow dpo` reads them: standard strings, conversational with an explicit
// prompt and with an implicit one, in JSONL or parquet; bad rows named by file and line with what was expected. And a DPO run on the
// conversational rows equals, to the bit, the run on the same pairs as strings through the chat template.
#include "hybridflow/finetune/preference_rows.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "hybridflow/finetune/dpo.h"
#include "hybridflow/finetune/reward_model_training.h"
#include "hybridflow/model/tokenizer.h"
#include "hybridflow/tasks/parquet_rows.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "support/testdata_dir.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

std::string write(testing::TempDir& dir, const std::string& name, const std::string& text) {
  std::ofstream(dir.file(name)) << text;
  return dir.file(name);
}

TEST(PreferenceRows, ReadsTrlsThreeFormats) {
  testing::TempDir dir;
  const std::string path = write(dir, "pairs.jsonl",
      R"({"prompt": "2+3=", "chosen": "5", "rejected": "6"})" "\n\n"
      R"({"prompt": [{"role": "user", "content": "2+3?"}], "chosen": [{"role": "assistant", "content": "5"}], )"
      R"("rejected": [{"role": "assistant", "content": "6"}]})" "\n"
      R"({"chosen": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}, )"
      R"({"role": "assistant", "content": "5"}], "rejected": [{"role": "system", "content": "Be brief."}, )"
      R"({"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "six"}]})" "\n");
  const auto rows = read_preference_rows(path);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].prompt.prompt, "2+3=");
  EXPECT_FALSE(rows[0].prompt.is_chat());
  EXPECT_EQ(rows[0].chosen, "5");
  EXPECT_EQ(rows[1].prompt.messages.size(), 1u);
  EXPECT_EQ(rows[1].chosen, "5");
  EXPECT_EQ(rows[1].rejected, "6");
  EXPECT_EQ(rows[1].prompt.where, path + ":3");  // the blank line counts
  ASSERT_EQ(rows[2].prompt.messages.size(), 2u);
  EXPECT_EQ(rows[2].prompt.messages[0]["content"], "Be brief.");
  EXPECT_EQ(rows[2].chosen, "5");
  EXPECT_EQ(rows[2].rejected, "six");
}

// The same pairs as parquet columns (TRL's datasets are often parquet): the same rows; a null prompt column is an
// implicit prompt.
TEST(PreferenceRows, ParquetColumnsReadAsTheirJsonLines) {
  testing::TempDir dir;
  using Json = nlohmann::ordered_json;
  const Json user = {{"role", "user"}, {"content", "2+3?"}};
  auto assistant = [](const std::string& text) { return Json{{"role", "assistant"}, {"content", text}}; };
  const std::vector<Json> rows = {
      {{"prompt", Json::array({user})}, {"chosen", Json::array({assistant("5")})}, {"rejected", Json::array({assistant("6")})}},
      {{"prompt", nullptr}, {"chosen", Json::array({user, assistant("5")})}, {"rejected", Json::array({user, assistant("7")})}},
  };
  write_parquet_rows(dir.file("pairs.parquet"), rows);
  const auto read = read_preference_rows(dir.file("pairs.parquet"));
  ASSERT_EQ(read.size(), 2u);
  EXPECT_EQ(read[0].prompt.messages, Json::array({user}));
  EXPECT_EQ(read[0].chosen, "5");
  EXPECT_EQ(read[1].prompt.messages, Json::array({user}));
  EXPECT_EQ(read[1].rejected, "7");
  EXPECT_EQ(read[1].prompt.where, dir.file("pairs.parquet") + ": row 1");
  const std::string e = testing::error_of([&] { read_preference_rows(dir.file("pairs.csv")); });
  EXPECT_NE(e.find("unknown preference file type"), std::string::npos) << e;
}

TEST(PreferenceRows, BadRowsNameTheLineAndWhatWasExpected) {
  testing::TempDir dir;
  const std::string u = R"({"role": "user", "content": "q"})", a5 = R"({"role": "assistant", "content": "5"})";
  const std::pair<std::string, std::string> cases[] = {
      {"not json", "not valid JSON"},
      {R"({"prompt": "q", "chosen": "5"})", "missing key \"rejected\""},
      {R"({"prompt": "q", "chosen": [)" + u + R"(], "rejected": "6"})", "must be the assistant's"},
      {R"({"prompt": "q", "chosen": [)" + u + "," + a5 + R"(], "rejected": "6"})", "one assistant message"},
      {R"({"chosen": [)" + u + "," + a5 + R"(], "rejected": [)" + a5 + "," + a5 + "]}", "share every message"},
      {R"({"chosen": "5", "rejected": "6"})", "without a \"prompt\" key"},
      {R"({"prompt": [{"role": "user"}], "chosen": "5", "rejected": "6"})", "string \"role\" and \"content\""},
  };
  for (const auto& [row, expected] : cases) {
    const std::string path = write(dir, "bad.jsonl", std::string(R"({"prompt": "ok", "chosen": "1", "rejected": "2"})") +
                                                         "\n" + row + "\n");
    const std::string e = testing::error_of([&] { read_preference_rows(path); });
    EXPECT_NE(e.find(path + ":2"), std::string::npos) << row << ": " << e;
    EXPECT_NE(e.find(expected), std::string::npos) << row << ": " << e;
  }
}

// Eight addition pairs written as strings, as chat messages with an explicit prompt and with an implicit one.
struct ChatPairFiles {
  std::string strings, explicit_chat, implicit_chat;
};
ChatPairFiles write_chat_pair_files(testing::TempDir& dir) {
  std::string strings, explicit_chat, implicit_chat;
  for (int i = 0; i < 8; ++i) {
    const std::string q = "What is " + std::to_string(i) + "+" + std::to_string(i + 2) + "?";
    const std::string good = std::to_string(2 * i + 2), bad = std::to_string(2 * i + 3);
    const std::string user = R"({"role": "user", "content": ")" + q + R"("})";
    auto assistant = [](const std::string& text) { return R"({"role": "assistant", "content": ")" + text + R"("})"; };
    strings += R"({"prompt": ")" + q + R"(", "chosen": ")" + good + R"(", "rejected": ")" + bad + "\"}\n";
    explicit_chat += R"({"prompt": [)" + user + R"(], "chosen": [)" + assistant(good) + R"(], "rejected": [)" +
                     assistant(bad) + "]}\n";
    implicit_chat += R"({"chosen": [)" + user + "," + assistant(good) + R"(], "rejected": [)" + user + "," +
                     assistant(bad) + "]}\n";
  }
  return {write(dir, "strings.jsonl", strings), write(dir, "explicit.jsonl", explicit_chat),
          write(dir, "implicit.jsonl", implicit_chat)};
}

std::string qwen_dir() { return testing::tokenizer_data_dir() + "/qwen3"; }

ModelConfig small_config(const Tokenizer& tok) {
  return testing::tiny_model_config(tok, {.hidden_size = 16, .intermediate_size = 32, .num_hidden_layers = 1,
                                          .num_attention_heads = 2, .num_key_value_heads = 1});
}

// The same pairs as chat messages, as one user message through data.apply_chat_template, and with an implicit
// prompt: the same token ids, so the same DPO run to the bit (Qwen3's published tokenizer and chat template).
TEST(PreferenceRows, ConversationalPairsTrainAsTheirChatTemplateRendersThem) {
  if (!std::filesystem::exists(qwen_dir() + "/tokenizer.json")) GTEST_SKIP() << "no Qwen3 tokenizer in " << qwen_dir();
  at::set_num_threads(1);
  testing::TempDir dir;
  const ChatPairFiles files = write_chat_pair_files(dir);
  const Tokenizer tok = Tokenizer::load(qwen_dir() + "/tokenizer.json");
  const ModelConfig config = small_config(tok);
  auto run = [&](const std::string& file, bool apply_chat_template) {
    DpoOptions o;
    o.train_file = file;
    o.model_dir = qwen_dir();
    o.apply_chat_template = apply_chat_template;
    o.lr = 1e-2;
    o.beta = 0.5;
    o.batch_size = 4;
    o.micro_batch_size = 4;
    o.steps = 3;
    CausalLM policy = testing::seeded_model(config, 1), reference = testing::seeded_model(config, 1);
    return train_dpo(o, policy, reference, tok);
  };
  const DpoResult templated = run(files.strings, true), explicit_result = run(files.explicit_chat, false),
                  implicit_result = run(files.implicit_chat, false), plain = run(files.strings, false);
  for (size_t i = 0; i < templated.history.size(); ++i) {
    EXPECT_EQ(explicit_result.history[i].loss, templated.history[i].loss) << "step " << i + 1;
    EXPECT_EQ(implicit_result.history[i].loss, templated.history[i].loss) << "step " << i + 1;
  }
  // The template is really applied: the plain prompts' tokens (no chat markup) train differently.
  EXPECT_NE(plain.history.back().loss, templated.history.back().loss);
  EXPECT_GT(templated.history.front().tokens, 0);
}

// `hybridflow rm` reads the same formats: a reward model trains to the bit alike on the three, scoring the
// prompt as the chat template renders it for the actor; its held-out accuracy reads the file the same way.
TEST(PreferenceRows, ConversationalPairsTrainARewardModelAsTheirChatTemplateRendersThem) {
  if (!std::filesystem::exists(qwen_dir() + "/tokenizer.json")) GTEST_SKIP() << "no Qwen3 tokenizer in " << qwen_dir();
  at::set_num_threads(1);
  testing::TempDir dir;
  const ChatPairFiles files = write_chat_pair_files(dir);
  const Tokenizer tok = Tokenizer::load(qwen_dir() + "/tokenizer.json");
  const ModelConfig config = small_config(tok);
  auto options = [&](const std::string& file, bool apply_chat_template) {
    RewardModelOptions o;
    o.train_file = file;
    o.eval_file = file;
    o.model_dir = qwen_dir();
    o.apply_chat_template = apply_chat_template;
    o.lr = 1e-2;
    o.batch_size = 4;
    o.micro_batch_size = 4;
    o.steps = 3;
    o.eval_every = 3;
    return o;
  };
  struct Run {
    RewardModelResult result;
    double accuracy;
  };
  auto run = [&](const std::string& file, bool apply_chat_template) {
    torch::manual_seed(1);
    CausalLM model(config, HeadKind::kValue);
    const RewardModelOptions o = options(file, apply_chat_template);
    RewardModelResult result = train_reward_model(o, model, tok);
    return Run{result, pairwise_accuracy(model, tok, file, o)};
  };
  const Run templated = run(files.strings, true), explicit_run = run(files.explicit_chat, false),
            implicit_run = run(files.implicit_chat, false), plain = run(files.strings, false);
  for (size_t i = 0; i < templated.result.history.size(); ++i) {
    EXPECT_EQ(explicit_run.result.history[i].loss, templated.result.history[i].loss) << "step " << i + 1;
    EXPECT_EQ(implicit_run.result.history[i].loss, templated.result.history[i].loss) << "step " << i + 1;
  }
  EXPECT_EQ(explicit_run.result.history.back().tokens, templated.result.history.back().tokens);
  EXPECT_GT(templated.result.history.back().tokens, plain.result.history.back().tokens);  // the chat markup
  EXPECT_NE(plain.result.history.back().loss, templated.result.history.back().loss);
  // The accuracy helper encodes the file as training did: it reproduces the accuracy training reported.
  EXPECT_EQ(templated.accuracy, templated.result.final_eval_accuracy);
  EXPECT_EQ(implicit_run.accuracy, implicit_run.result.final_eval_accuracy);
}

}  // namespace
}  // namespace hybridflow
