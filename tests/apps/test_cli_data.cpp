// `hybridflow data`: a built-in task written as data files, read back as the trainer reads them.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "hybridflow/core/fs.h"
#include "hybridflow/tasks/dataset.h"
#include "hybridflow/tasks/prompt_rows.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace {

using hybridflow::testing::CommandResult;
using hybridflow::testing::run_hybridflow;

// "What is 12+34? ..." -> 12 + 34, so that a row's ground truth can be checked against its own question.
long long sum_asked(const std::string& question) {
  const size_t a = question.find("What is ") + 8, plus = question.find('+', a), end = question.find('?', plus);
  return std::stoll(question.substr(a, plus - a)) + std::stoll(question.substr(plus + 1, end - plus - 1));
}

TEST(CliData, WritesTheAdditionTaskAsVerlParquetWithChatMessages) {
  hybridflow::testing::TempDir dir;
  const CommandResult r = run_hybridflow("data --task addition --format parquet --train-size 30 --test-size 6 --seed 5 "
                                         "--out " + dir.file("addition"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("train.parquet (30 rows)"), std::string::npos) << r.output;
  const auto train = hybridflow::read_prompt_rows(dir.file("addition/train.parquet"));
  const auto test = hybridflow::read_prompt_rows(dir.file("addition/test.parquet"));
  ASSERT_EQ(train.size(), 30u);
  ASSERT_EQ(test.size(), 6u);
  std::set<std::string> train_questions;
  for (size_t i = 0; i < train.size(); ++i) {
    const auto& row = train[i];
    ASSERT_TRUE(row.is_chat());
    ASSERT_EQ(row.messages.size(), 1u);
    EXPECT_EQ(row.messages[0]["role"], "user");
    const std::string question = row.messages[0]["content"];
    EXPECT_EQ(std::to_string(sum_asked(question)), row.answer) << question;
    EXPECT_EQ(row.data_source, "addition");
    EXPECT_EQ(row.extra_info, (nlohmann::ordered_json{{"split", "train"}, {"index", i}}));
    train_questions.insert(question);
  }
  for (const auto& row : test) {
    EXPECT_EQ(row.extra_info["split"], "test");
    EXPECT_EQ(train_questions.count(row.messages[0]["content"]), 0u);  // no held-out prompt trained on
  }
}

TEST(CliData, WritesVerlJsonlAndTheOlderRowsAndNamesABadFormat) {
  hybridflow::testing::TempDir dir;
  ASSERT_EQ(run_hybridflow("data --task reverse --format verl-jsonl --train-size 4 --test-size 2 --out " + dir.path())
                .exit_code,
            0);
  const auto verl = hybridflow::read_prompt_rows(dir.file("train.jsonl"));
  ASSERT_EQ(verl.size(), 4u);
  EXPECT_NE(verl[0].messages[0]["content"].get<std::string>().find("Reverse the letters"), std::string::npos);
  EXPECT_EQ(verl[0].data_source, "reverse");

  ASSERT_EQ(run_hybridflow("data --task addition --train-size 4 --test-size 2 --out " + dir.file("plain")).exit_code, 0);
  const auto plain = hybridflow::read_examples_jsonl(dir.file("plain/train.jsonl"));
  ASSERT_EQ(plain.size(), 4u);
  EXPECT_EQ(plain[0].prompt.back(), '=');

  const CommandResult bad = run_hybridflow("data --task addition --format csv --out " + dir.path());
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("--format must be jsonl, parquet or verl-jsonl, got 'csv'"), std::string::npos) << bad.output;
}

}  // namespace
