// The RL trainer on verl-format data over real worker processes: parquet rows reach the command scorer
// with their data_source, ground_truth and extra_info, each next to its own responses (rollout.n of them),
// and a megabyte-long prompt fails at load, or is cut or dropped, before any worker sees it.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/jsonl.h"
#include "hybridflow/engine/prompt_encoder.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/tasks/parquet_rows.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "support/tiny_rl_config.h"

using namespace hybridflow;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

namespace {

using Json = nlohmann::ordered_json;
using hybridflow::testing::error_of;
using hybridflow::testing::tiny_rl_overrides;

// A command scorer that appends every request line it reads to `log` and scores 0.
std::string logging_scorer(const std::string& log) {
  return "reward.shell=/usr/bin/python3 -c \"import sys\nfor l in sys.stdin:\n  open('" + log +
         "','a').write(l)\n  print(0.0, flush=True)\"";
}

TEST(RlVerlData, ParquetRowsReachTheScorerWithTheirOwnResponses) {
  hybridflow::testing::TempDir dir;
  std::vector<Json> rows;
  for (int i = 0; i < 4; ++i)  // plain-string prompts: the preset's character tokenizer has no chat template
    rows.push_back({{"data_source", i % 2 ? "odd" : "even"},
                    {"prompt", std::to_string(i) + "+1="},
                    {"reward_model", {{"style", "rule"}, {"ground_truth", std::to_string(i + 1)}}},
                    {"extra_info", {{"index", i}, {"tags", {"t" + std::to_string(i)}}}}});
  write_parquet_rows(dir.file("train.parquet"), rows);
  const std::string log = dir.file("requests.jsonl");
  RLTrainer trainer(load_rl_config(
      "", tiny_rl_overrides("grpo", {"data.train_file=" + dir.file("train.parquet"), "data.shuffle=false",
                                     "reward.type=command", logging_scorer(log)})));
  trainer.step();
  trainer.step();
  const auto seen = read_jsonl(log);
  ASSERT_EQ(seen.size(), 8u);  // 2 steps x 2 prompts x rollout.n = 2
  for (size_t k = 0; k < seen.size(); ++k) {
    const int i = static_cast<int>(k / 2);  // in order (shuffle off), each prompt's two samples together
    SCOPED_TRACE(seen[k].dump());
    EXPECT_EQ(seen[k]["prompt"], std::to_string(i) + "+1=");
    EXPECT_EQ(seen[k]["ground_truth"], std::to_string(i + 1));
    EXPECT_EQ(seen[k]["answer"], std::to_string(i + 1));
    EXPECT_EQ(seen[k]["data_source"], i % 2 ? "odd" : "even");
    EXPECT_EQ(seen[k]["extra_info"], (nlohmann::json{{"index", i}, {"tags", {"t" + std::to_string(i)}}}));
  }
}

TEST(RlVerlData, GeneratedTaskDataNamesTheTaskAsItsSource) {
  hybridflow::testing::TempDir dir;
  const std::string log = dir.file("requests.jsonl");
  RLTrainer trainer(load_rl_config("", tiny_rl_overrides("grpo", {"reward.type=command", logging_scorer(log)})));
  trainer.step();
  const auto seen = read_jsonl(log);
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0]["data_source"], "addition");
  EXPECT_EQ(seen[0]["extra_info"], nlohmann::json::object());
  EXPECT_EQ(seen[0]["ground_truth"], seen[0]["answer"]);
}

TEST(RlVerlData, AMegabytePromptFailsAtLoadOrIsCutOrDropped) {
  hybridflow::testing::TempDir dir;
  const std::string train = dir.file("train.jsonl");
  {
    std::ofstream out(train);
    out << R"({"prompt": ")" << std::string(1 << 20, '7') << R"(+1=", "answer": "8"})" << "\n";
    for (int i = 0; i < 3; ++i) out << R"({"prompt": ")" << i << R"(+1=", "answer": ")" << i + 1 << "\"}\n";
  }
  auto config = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> o = {"data.train_file=" + train, "data.shuffle=false", "data.max_prompt_length=16"};
    o.insert(o.end(), extra.begin(), extra.end());
    return load_rl_config("", tiny_rl_overrides("grpo", o));
  };
  auto start = std::chrono::steady_clock::now();
  const std::string msg = error_of([&] { RLTrainer trainer(config({})); });
  EXPECT_NE(msg.find(train + ":1: the prompt is 1048580 tokens, longer than data.max_prompt_length = 16"), std::string::npos)
      << msg;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);

  // Cut to its last 16 tokens, the long prompt trains in the first batch like any other.
  {
    RLTrainer trainer(config({"data.truncation=left"}));
    const nlohmann::json record = trainer.step();
    EXPECT_TRUE(record.contains("actor/pg_loss")) << record.dump();
  }
  // Dropped: the three short prompts remain.
  {
    const std::string log = dir.file("requests.jsonl");
    RLTrainer trainer(config({"data.filter_overlong_prompts=true", "reward.type=command", logging_scorer(log)}));
    trainer.step();
    const auto seen = read_jsonl(log);
    ASSERT_EQ(seen.size(), 4u);
    EXPECT_EQ(seen[0]["prompt"], "0+1=");
    EXPECT_EQ(seen[2]["prompt"], "1+1=");
  }
}

// verl's data.prompt_key and data.reward_fn_key: a dataset whose prompt is in "question" and whose source is
// in "source" trains with the two keys, and without them fails naming the column and the key.
TEST(RlVerlData, PromptAndSourceColumnsComeFromTheirKeys) {
  hybridflow::testing::TempDir dir;
  std::vector<Json> rows;
  for (int i = 0; i < 4; ++i)
    rows.push_back({{"source", i % 2 ? "odd" : "even"},
                    {"question", std::to_string(i) + "+1="},
                    {"reward_model", {{"style", "rule"}, {"ground_truth", std::to_string(i + 1)}}}});
  write_parquet_rows(dir.file("train.parquet"), rows);
  const std::string log = dir.file("requests.jsonl");
  RLTrainer trainer(load_rl_config(
      "", tiny_rl_overrides("grpo", {"data.train_file=" + dir.file("train.parquet"), "data.shuffle=false",
                                     "data.prompt_key=question", "data.reward_fn_key=source", "reward.type=command",
                                     logging_scorer(log)})));
  trainer.step();
  const auto seen = read_jsonl(log);
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0]["prompt"], "0+1=");
  EXPECT_EQ(seen[0]["data_source"], "even");
  EXPECT_EQ(seen[2]["prompt"], "1+1=");
  EXPECT_EQ(seen[2]["data_source"], "odd");

  const std::string msg = error_of([&] {
    RLTrainer t(load_rl_config("", tiny_rl_overrides("grpo", {"data.train_file=" + dir.file("train.parquet"),
                                                              "data.prompt_key=problem"})));
  });
  EXPECT_NE(msg.find(dir.file("train.parquet") + ": row 0: missing column 'problem' (data.prompt_key)"),
            std::string::npos)
      << msg;
}

TEST(RlVerlData, ChatRowsNeedAModelWithATemplate) {
  hybridflow::testing::TempDir dir;
  write_parquet_rows(dir.file("chat.parquet"),
                     {Json{{"prompt", Json::array({{{"role", "user"}, {"content", "1+1="}}})},
                           {"reward_model", {{"style", "rule"}, {"ground_truth", "2"}}}}});
  const std::string msg = error_of([&] {
    RLTrainer trainer(load_rl_config("", tiny_rl_overrides("grpo", {"data.train_file=" + dir.file("chat.parquet"),
                                                                      "data.train_batch_size=1"})));
  });
  EXPECT_NE(msg.find(dir.file("chat.parquet") + ": row 0: the prompt has chat messages"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.path is empty"), std::string::npos) << msg;
}

TEST(PromptOptions, ReadTheDataSectionAndNameBadKeys) {
  const PromptOptions o = PromptOptions::from_config(load_rl_config(
      "", {"data.max_prompt_length=64", "data.truncation=middle", "data.filter_overlong_prompts=true",
           "data.apply_chat_template=true"}));
  EXPECT_EQ(o.max_prompt_length, 64);
  EXPECT_EQ(o.truncation, Truncation::kMiddle);
  EXPECT_TRUE(o.filter_overlong_prompts);
  EXPECT_TRUE(o.apply_chat_template);
  const PromptOptions d = PromptOptions::from_config(load_rl_config("", {}));
  EXPECT_EQ(d.max_prompt_length, 512);  // verl's defaults
  EXPECT_EQ(d.truncation, Truncation::kError);
  EXPECT_FALSE(d.filter_overlong_prompts);
  EXPECT_NE(error_of([] { PromptOptions::from_config(load_rl_config("", {"data.truncation=sideways"})); })
                .find("data.truncation"),
            std::string::npos);
  EXPECT_NE(error_of([] { PromptOptions::from_config(load_rl_config("", {"data.max_prompt_length=0"})); })
                .find("data.max_prompt_length must be > 0"),
            std::string::npos);
}

// verl's data.apply_chat_template_kwargs (a free-form map, as Hydra's +key=value adds it) and
// actor_rollout_ref.model.custom_chat_template reach the prompt encoder typed as YAML reads them.
TEST(PromptOptions, ChatTemplateKwargsAndACustomTemplate) {
  const PromptOptions o = PromptOptions::from_config(load_rl_config(
      "", {"+data.apply_chat_template_kwargs.enable_thinking=False", "+data.apply_chat_template_kwargs.budget=3",
           "+data.apply_chat_template_kwargs.persona='a tutor'",
           "actor_rollout_ref.model.custom_chat_template='{{ messages[0].content }}'"}));
  EXPECT_EQ(o.chat_template_kwargs, (nlohmann::ordered_json{{"enable_thinking", false}, {"budget", 3}, {"persona", "a tutor"}}));
  EXPECT_EQ(o.custom_chat_template, "{{ messages[0].content }}");
  const PromptOptions d = PromptOptions::from_config(load_rl_config("", {}));
  EXPECT_TRUE(d.chat_template_kwargs.empty());
  EXPECT_TRUE(d.custom_chat_template.empty());
  const std::string reserved =
      error_of([] { PromptOptions::from_config(load_rl_config("", {"+data.apply_chat_template_kwargs.tools=[]"})); });
  EXPECT_NE(reserved.find("data.apply_chat_template_kwargs.tools: the trainer sets this template variable itself"),
            std::string::npos)
      << reserved;
  const std::string bad = error_of([] {
    PromptOptions::from_config(load_rl_config("", {"actor_rollout_ref.model.custom_chat_template='{% for m in x %}'"}));
  });
  EXPECT_NE(bad.find("actor_rollout_ref.model.custom_chat_template: not a template hybridflow can render"),
            std::string::npos)
      << bad;
}

// verl's custom_reward_function: the file's compute_score, called with verl's keyword arguments and
// reward_kwargs, scores every response (its dict result's "score"); the dumped rows' scores are what it returned.
TEST(CustomRewardFunction, VerlsComputeScoreScoresEveryResponse) {
  hybridflow::testing::TempDir dir;
  write_file_atomic(dir.file("my_reward.py"),
                    "def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):\n"
                    "    ok = isinstance(solution_str, str) and data_source == 'addition' and isinstance(extra_info, dict)\n"
                    "    return {'score': float(ground_truth) / 1000.0 + bonus + (0.0 if ok else 100.0), 'acc': 0.0}\n");
  auto overrides = [&](std::vector<std::string> more, const std::string& run) {
    more.insert(more.end(), {"custom_reward_function.path=" + dir.file("my_reward.py"),
                             "trainer.total_steps=1", "trainer.run_dir=" + dir.file(run),
                             "trainer.rollout_data_dir=" + dir.file("rollouts")});
    return tiny_rl_overrides("grpo", more);
  };
  RLTrainer trainer(load_rl_config("", overrides({"+custom_reward_function.reward_kwargs.bonus=1"}, "run")));
  const nlohmann::json record = trainer.step();
  const auto rows = read_jsonl(dir.file("rollouts") + "/1.jsonl");
  ASSERT_EQ(rows.size(), 4u);
  double total = 0;
  for (const auto& r : rows) {
    EXPECT_NEAR(r.at("score").get<double>(), std::stod(r.at("gts").get<std::string>()) / 1000.0 + 1.0, 1e-6)
        << r.dump();  // scores travel as float32
    total += r.at("score").get<double>();
  }
  EXPECT_NEAR(record.at("score/mean").get<double>(), total / 4, 1e-12);

  const std::string missing = error_of([&] {
    RLTrainer t(load_rl_config("", tiny_rl_overrides("grpo", {"custom_reward_function.path=" + dir.file("nope.py")})));
  });
  EXPECT_NE(missing.find("custom_reward_function.path: no file " + dir.file("nope.py")), std::string::npos) << missing;
  const std::string both = error_of([&] {
    RLTrainer t(load_rl_config("", overrides({"reward.type=command", "reward.shell=echo 1"}, "both")));
  });
  EXPECT_NE(both.find("custom_reward_function.path and reward.type = command both choose the reward"),
            std::string::npos)
      << both;
  const std::string no_function = error_of([&] {
    RLTrainer t(load_rl_config("", overrides({"custom_reward_function.name=score_it"}, "no_function")));
    t.step();
  });
  EXPECT_NE(no_function.find("command 'python3 -c import"), std::string::npos) << no_function;
  EXPECT_NE(no_function.find("has no function 'score_it'"), std::string::npos) << no_function;  // the scorer's stderr
  EXPECT_EQ(no_function.find("spec.loader"), std::string::npos) << "the adapter's body is not repeated: " << no_function;
}

TEST(ResponseLength, VerlsDataKeyUnlessTheRolloutKeyIsSet) {
  EXPECT_EQ(rl_response_length(load_rl_config("", {})), 16);
  EXPECT_EQ(rl_response_length(load_rl_config("", {"data.max_response_length=64"})), 64);
  EXPECT_EQ(rl_response_length(load_rl_config("", {"actor_rollout_ref.rollout.response_length=8"})), 8);
  EXPECT_EQ(rl_response_length(load_rl_config(
                "", {"data.max_response_length=64", "actor_rollout_ref.rollout.response_length=8"})),
            8);
}

}  // namespace
