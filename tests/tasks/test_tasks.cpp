#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>

#include "hybridflow/core/error.h"
#include "hybridflow/core/jsonl.h"
#include "hybridflow/tasks/dataset.h"
#include "hybridflow/tasks/task.h"
#include "support/temp_dir.h"

namespace hybridflow {
namespace {

bool only_chars_of(const std::string& s, const std::string& alphabet) {
  return std::all_of(s.begin(), s.end(), [&](char c) { return alphabet.find(c) != std::string::npos; });
}

TEST(Tasks, AdditionAnswersAreTheSumOfTheOperands) {
  TaskOptions o;
  o.min_digits = 2;
  o.max_digits = 3;
  auto task = make_task("addition", o);
  std::mt19937_64 rng(1);
  for (int i = 0; i < 200; ++i) {
    Example ex = task->sample(rng);
    ASSERT_EQ(ex.prompt.back(), '=');
    const auto plus = ex.prompt.find('+');
    const std::string a = ex.prompt.substr(0, plus), b = ex.prompt.substr(plus + 1, ex.prompt.size() - plus - 2);
    EXPECT_GE(a.size(), 2u);
    EXPECT_LE(b.size(), 3u);
    EXPECT_NE(a[0], '0');
    EXPECT_EQ(std::stol(ex.answer), std::stol(a) + std::stol(b)) << ex.prompt;
    EXPECT_TRUE(only_chars_of(ex.prompt + ex.answer, task->alphabet()));
    EXPECT_EQ(task->score(ex.answer, ex), 1.0);
    EXPECT_EQ(task->score(" " + ex.answer + "\n", ex), 1.0);
    EXPECT_EQ(task->score(ex.answer + "0", ex), 0.0);
  }
}

TEST(Tasks, ReversedAdditionWritesTheLeastSignificantDigitFirst) {
  auto plain = make_task("addition");
  auto reversed = make_task("addition_reversed");
  EXPECT_EQ(reversed->name(), "addition_reversed");
  std::mt19937_64 r1(5), r2(5);
  for (int i = 0; i < 50; ++i) {
    Example p = plain->sample(r1), r = reversed->sample(r2);
    EXPECT_EQ(p.prompt, r.prompt);
    EXPECT_EQ(std::string(p.answer.rbegin(), p.answer.rend()), r.answer);
  }
}

TEST(Tasks, ReverseAndSort) {
  std::mt19937_64 rng(2);
  auto rev = make_task("reverse");
  auto sort = make_task("sort");
  for (int i = 0; i < 50; ++i) {
    Example r = rev->sample(rng);
    std::string s = r.prompt.substr(0, r.prompt.size() - 1);
    EXPECT_EQ(r.answer, std::string(s.rbegin(), s.rend()));
    EXPECT_GE(s.size(), 3u);
    EXPECT_LE(s.size(), 6u);
    EXPECT_TRUE(only_chars_of(r.prompt + r.answer, rev->alphabet()));
    Example q = sort->sample(rng);
    EXPECT_TRUE(std::is_sorted(q.answer.begin(), q.answer.end()));
    std::string digits = q.prompt.substr(0, q.prompt.size() - 1);
    EXPECT_TRUE(std::is_permutation(digits.begin(), digits.end(), q.answer.begin(), q.answer.end()));
  }
}

TEST(Tasks, UnknownNameListsValidNames) {
  try {
    make_task("multiplication");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("multiplication"), std::string::npos);
    for (const auto& n : task_names()) EXPECT_NE(msg.find(n), std::string::npos) << n;
  }
  TaskOptions bad;
  bad.min_digits = 3;
  bad.max_digits = 2;
  EXPECT_THROW(make_task("addition", bad), Error);
}

TEST(Tasks, CorruptionAlwaysChangesTheAnswerButKeepsItsShape) {
  auto task = make_task("addition");
  std::mt19937_64 rng(3);
  for (int i = 0; i < 200; ++i) {
    Example ex = task->sample(rng);
    std::string bad = task->corrupt(ex.answer, rng);
    EXPECT_NE(bad, ex.answer);
    EXPECT_EQ(bad.size(), ex.answer.size());
    EXPECT_TRUE(only_chars_of(bad, "0123456789"));
    EXPECT_EQ(task->score(bad, ex), 0.0);
  }
}

TEST(Dataset, SplitsAreDisjointDeterministicAndRoundTrip) {
  auto task = make_task("addition");
  auto a = make_splits(*task, 300, 50, 42);
  auto b = make_splits(*task, 300, 50, 42);
  ASSERT_EQ(a.train.size(), 300u);
  ASSERT_EQ(a.test.size(), 50u);
  std::set<std::string> train_prompts, test_prompts;
  for (const auto& ex : a.train) train_prompts.insert(ex.prompt);
  for (const auto& ex : a.test) test_prompts.insert(ex.prompt);
  EXPECT_EQ(test_prompts.size(), 50u);  // held-out prompts are distinct
  for (const auto& ex : a.test) EXPECT_EQ(train_prompts.count(ex.prompt), 0u) << ex.prompt;
  for (size_t i = 0; i < a.train.size(); ++i) EXPECT_EQ(a.train[i].prompt, b.train[i].prompt);
  auto c = make_splits(*task, 300, 50, 43);
  EXPECT_NE(a.test[0].prompt + a.test[1].prompt, c.test[0].prompt + c.test[1].prompt);

  testing::TempDir dir;
  write_examples_jsonl(dir.file("train.jsonl"), a.train);
  auto back = read_examples_jsonl(dir.file("train.jsonl"));
  ASSERT_EQ(back.size(), a.train.size());
  for (size_t i = 0; i < back.size(); ++i) {
    EXPECT_EQ(back[i].prompt, a.train[i].prompt);
    EXPECT_EQ(back[i].answer, a.train[i].answer);
  }
}

TEST(Dataset, DroppingHeldOutPromptsKeepsTheRestInOrder) {
  auto task = make_task("addition");
  // Different seeds overlap on a small space: one- and two-digit sums have at most 10,000 prompts.
  auto held_out = make_splits(*task, 0, 2000, 1).test;
  auto train = make_splits(*task, 3000, 0, 2).train;
  std::set<std::string> held;
  for (const auto& ex : held_out) held.insert(ex.prompt);
  std::vector<std::string> expected;
  for (const auto& ex : train)
    if (!held.count(ex.prompt)) expected.push_back(ex.prompt);
  ASSERT_LT(expected.size(), train.size()) << "the two samples should overlap for this test to mean anything";

  const int64_t removed = drop_prompts_of(held_out, &train);
  EXPECT_EQ(removed, 3000 - static_cast<int64_t>(expected.size()));
  ASSERT_EQ(train.size(), expected.size());
  for (size_t i = 0; i < train.size(); ++i) EXPECT_EQ(train[i].prompt, expected[i]);
}

TEST(Dataset, TooSmallATaskSpaceIsAnError) {
  TaskOptions o;
  o.min_digits = o.max_digits = 1;  // 100 distinct prompts at most
  auto task = make_task("addition", o);
  EXPECT_NO_THROW(make_splits(*task, 500, 20, 1));  // training draws repeat; the held-out 20 are distinct
  EXPECT_THROW(make_splits(*task, 10, 101, 1), Error);  // more held-out prompts than the space has
  try {
    make_splits(*task, 10, 100, 1);  // the whole space held out: no training prompt is left
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the held-out set"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'addition'"), std::string::npos) << e.what();
  }
}

// On a small space the training split keeps the task's own mix of operand lengths, as the held-out set has
// it: 1-2 digit sums draw each operand's length uniformly, a quarter of the draws each for 1+1, 1+2, 2+1 and
// 2+2 digits. Only 100 problems are one-plus-one digit; the held-out set takes about a third of them, so
// training draws of those are ~18%, as are the held-out set's (distinct, the repeats dropped). The old
// distinct-prompt split left them 0.8% of 8,000 training problems and two-plus-two 78%.
TEST(Dataset, TrainingKeepsTheTasksMixOnASmallSpace) {
  TaskOptions o;
  o.min_digits = 1;
  o.max_digits = 2;
  auto task = make_task("addition", o);
  const auto splits = make_splits(*task, 8000, 200, 1);
  auto share = [](const std::vector<Example>& examples, size_t prompt_length) {
    int64_t n = 0;
    for (const auto& ex : examples) n += ex.prompt.size() == prompt_length;
    return static_cast<double>(n) / static_cast<double>(examples.size());
  };
  const double train_1_1 = share(splits.train, 4), test_1_1 = share(splits.test, 4);  // "a+b="
  const double train_2_2 = share(splits.train, 6), test_2_2 = share(splits.test, 6);  // "ab+cd="
  EXPECT_NEAR(train_1_1, test_1_1, 0.06) << "one-plus-one digit shares, training and held-out";
  EXPECT_GT(train_1_1, 0.12);
  EXPECT_NEAR(train_2_2, test_2_2, 0.08) << "two-plus-two digit shares, training and held-out";
  EXPECT_LT(train_2_2, 0.35);
}

TEST(Dataset, ReadErrorsNameFileAndLine) {
  testing::TempDir dir;
  const std::string path = dir.file("bad.jsonl");
  std::ofstream(path) << "{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n\n{\"prompt\": \"2+2=\"}\n";
  try {
    read_examples_jsonl(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path + ":3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("response"), std::string::npos) << e.what();
  }
  std::ofstream(path) << "{\"prompt\": \"1+1=\", \"response\": \"2\"}\nnot json\n";
  try {
    read_examples_jsonl(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path + ":2"), std::string::npos) << e.what();
  }
}

TEST(Dataset, PreferencePairsRoundTrip) {
  auto task = make_task("reverse");
  auto splits = make_splits(*task, 20, 0, 7);
  auto pairs = make_preference_pairs(*task, splits.train, 9);
  ASSERT_EQ(pairs.size(), 20u);
  for (size_t i = 0; i < pairs.size(); ++i) {
    EXPECT_EQ(pairs[i].chosen, splits.train[i].answer);
    EXPECT_NE(pairs[i].rejected, pairs[i].chosen);
  }
  testing::TempDir dir;
  write_preference_jsonl(dir.file("pairs.jsonl"), pairs);
  auto back = read_jsonl(dir.file("pairs.jsonl"));
  ASSERT_EQ(back.size(), pairs.size());
  EXPECT_EQ(back[5].at("rejected"), pairs[5].rejected);
  EXPECT_EQ(back[5].at("prompt"), pairs[5].prompt);
  EXPECT_EQ(back[5].at("chosen"), pairs[5].chosen);
}

}  // namespace
}  // namespace hybridflow
