// Watching an RL run: the rollout samples (samples.jsonl and TensorBoard text) and the per-step timeline of
// calls per worker pool (timeline.jsonl) the trainer writes beside its metrics, read back by the HTML report
// and by the `tensorboard` package; the pure pieces (row choice, records, the call timeline) on their own; and
// verl's generation dumps (every rollout and validation row per step) with the validations around a run.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "hybridflow/core/error.h"
#include "hybridflow/core/jsonl.h"
#include "hybridflow/report/html_report.h"
#include "hybridflow/report/run_data.h"
#include "hybridflow/runtime/call_timeline.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/metrics_log.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/trainer/step_records.h"
#include "hybridflow/workers/rl_workers.h"
#include "report/python_oracle.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "support/tiny_rl_config.h"

using namespace hybridflow;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

using hybridflow::testing::tiny_rl_overrides;

namespace {

using Clock = CallSpan::Clock;

TEST(StepRecords, SampleRowsSpreadOverTheBatch) {
  EXPECT_EQ(sample_rows(8, 4), (std::vector<int64_t>{0, 2, 4, 6}));  // 4 prompts x 2 responses: one each
  EXPECT_EQ(sample_rows(10, 3), (std::vector<int64_t>{0, 3, 6}));
  EXPECT_EQ(sample_rows(3, 10), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_TRUE(sample_rows(8, 0).empty());
  EXPECT_TRUE(sample_rows(0, 4).empty());
  EXPECT_FALSE(logs_samples_at(1, 2));
  EXPECT_TRUE(logs_samples_at(2, 2));
  EXPECT_TRUE(logs_samples_at(4, 2));
  EXPECT_FALSE(logs_samples_at(4, 0));
  EXPECT_FALSE(logs_samples_at(0, 1));
}

TEST(StepRecords, ASampleRecordWritesNonFiniteAsNull) {
  RolloutSample s;
  s.prompt = "12+7=";
  s.response = "19";
  s.score = 1.0;
  s.reward = 0.75;
  s.advantage = NAN;
  s.response_length = 2;
  const nlohmann::json r = sample_record(5, s);
  EXPECT_EQ(r.at("step"), 5);
  EXPECT_EQ(r.at("prompt"), "12+7=");
  EXPECT_EQ(r.at("response"), "19");
  EXPECT_EQ(r.at("score"), 1.0);
  EXPECT_EQ(r.at("reward"), 0.75);
  EXPECT_TRUE(r.at("advantage").is_null());
  EXPECT_EQ(r.at("response_length"), 2);
  const std::string md = rollout_samples_markdown({s});
  EXPECT_NE(md.find("    19"), std::string::npos) << md;  // model output in a code block
}

TEST(CallTimeline, ACallQueuedBehindAnotherInItsPoolStartsWhenThatOneEnds) {
  CallTimeline timeline;
  const auto sent = Clock::now() - std::chrono::seconds(10);  // both sent at once, long ago
  timeline.call_finished("global", "actor", "compute_log_prob", sent);
  timeline.call_finished("global", "actor", "compute_ref_log_prob", sent);
  timeline.call_finished("critic", "critic", "compute_values", sent);  // another pool: not queued behind them
  const auto spans = timeline.take();
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[0].start, sent);
  EXPECT_EQ(spans[1].start, spans[0].end);
  EXPECT_GE(spans[1].end, spans[1].start);
  EXPECT_EQ(spans[2].pool, "critic");
  EXPECT_EQ(spans[2].start, sent);
  EXPECT_TRUE(timeline.take().empty());

  const auto step_start = sent;
  const auto rows = timeline_records(3, spans, step_start, 1.7e9);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].at("call"), "actor.compute_log_prob");
  EXPECT_EQ(rows[0].at("pool"), "global");
  EXPECT_EQ(rows[0].at("step"), 3);
  EXPECT_DOUBLE_EQ(rows[0].at("start_s").get<double>(), 0.0);
  EXPECT_GE(rows[1].at("start_s").get<double>(), 10.0);
  for (const auto& r : rows) EXPECT_LE(r.at("start_s").get<double>(), r.at("end_s").get<double>());
}

TEST(MetricsLog, AResumeDropsLaterSamplesAndTimelineRowsToo) {
  hybridflow::testing::TempDir dir;
  MetricsLog log(dir.path());
  for (int64_t step = 1; step <= 3; ++step) {
    log.add_samples(step, {{{"step", step}, {"prompt", "p"}, {"response", "r"}}}, "text");
    log.add_timeline({{{"step", step}, {"pool", "global"}, {"call", "actor.x"}, {"start_s", 0}, {"end_s", 1}}});
    log.set("score/mean", 0.5);
    log.end_step(step);
  }
  EXPECT_EQ(log.drop_steps_after(1), 2);
  for (const char* file : {"/metrics.jsonl", "/samples.jsonl", "/timeline.jsonl"}) {
    const auto rows = read_jsonl(dir.path() + file);
    ASSERT_EQ(rows.size(), 1u) << file;
    EXPECT_EQ(rows[0].at("step"), 1) << file;
  }
}

// The calls each step's timeline must show, as "pool role.method".
std::map<int64_t, std::set<std::string>> calls_per_step(const std::vector<nlohmann::json>& rows) {
  std::map<int64_t, std::set<std::string>> out;
  for (const auto& r : rows) {
    EXPECT_LE(r.at("start_s").get<double>(), r.at("end_s").get<double>()) << r.dump();
    EXPECT_GE(r.at("start_s").get<double>(), 0.0) << r.dump();
    EXPECT_GT(r.at("step_start_unix_s").get<double>(), 1e9) << r.dump();
    out[r.at("step").get<int64_t>()].insert(r.at("pool").get<std::string>() + " " + r.at("call").get<std::string>());
  }
  return out;
}

TEST(RolloutSamples, GrpoWritesKSamplesEveryFreqStepsAndATimelinePerStep) {
  hybridflow::testing::TempDir dir;
  RLTrainer trainer(load_rl_config(
      "", tiny_rl_overrides("grpo", {"trainer.run_dir=" + dir.path(), "trainer.total_steps=3",
                                     "trainer.log_samples_freq=2", "trainer.log_samples_count=3"})));
  trainer.fit();

  // Step 2 only (every 2nd of 3), 3 of its 4 rows.
  const auto samples = read_jsonl(dir.path() + "/samples.jsonl");
  ASSERT_EQ(samples.size(), 3u);
  std::set<std::string> prompts;
  for (const auto& s : samples) {
    EXPECT_EQ(s.at("step"), 2) << s.dump();
    for (const char* key : {"score", "reward", "advantage"}) {
      ASSERT_TRUE(s.at(key).is_number()) << key << " in " << s.dump();
      EXPECT_TRUE(std::isfinite(s.at(key).get<double>())) << key << " in " << s.dump();
    }
    EXPECT_EQ(s.at("reward"), s.at("score")) << "GRPO has no KL in the reward: " << s.dump();
    EXPECT_GE(s.at("score").get<double>(), 0.0);
    EXPECT_LE(s.at("score").get<double>(), 1.0);
    const int64_t length = s.at("response_length").get<int64_t>();
    EXPECT_GE(length, 0);
    EXPECT_LE(length, 4);
    EXPECT_TRUE(s.at("response").is_string());
    EXPECT_NE(s.at("prompt").get<std::string>(), "") << s.dump();
    prompts.insert(s.at("prompt").get<std::string>());
  }
  EXPECT_EQ(prompts.size(), 2u) << "the samples come from both prompts of the step";

  // Every step: the actor's calls in the one colocated pool, and the controller's own work.
  const auto per_step = calls_per_step(read_jsonl(dir.path() + "/timeline.jsonl"));
  ASSERT_EQ(per_step.size(), 3u);
  for (const auto& [step, calls] : per_step) {
    for (const char* call : {"global actor.generate_sequences", "global actor.compute_log_prob",
                             "global actor.update_actor", "controller controller.rule_score",
                             "controller controller.advantage"})
      EXPECT_TRUE(calls.count(call)) << "step " << step << " lacks " << call;
  }

  // The report reads both: a Gantt chart and the samples table.
  const report::RunData run = report::load_run(dir.path());
  EXPECT_EQ(run.samples.size(), 3u);
  EXPECT_FALSE(run.timeline.empty());
  for (const auto& span : run.timeline) EXPECT_GT(span.start_s, 1e9) << "placed on the wall clock";
  report::ReportSummary summary;
  const std::string html = report::render_html_report(dir.path(), &summary);
  EXPECT_NE(html.find("<h2>Timeline</h2>"), std::string::npos);
  EXPECT_NE(html.find("Rollout samples"), std::string::npos);
  EXPECT_EQ(summary.samples, 3u);

  // TensorBoard's text plugin finds the samples at step 2, and only there.
  const auto r = hybridflow::testing::run_report_script(
      "read_events.py", hybridflow::testing::shell_quote(dir.path() + "/tensorboard"), dir.path());
  ASSERT_EQ(r.exit_code, 0);
  const nlohmann::json got = nlohmann::json::parse(r.output);
  int texts = 0;
  for (const auto& t : got.at("texts")) {
    EXPECT_EQ(t[0], "samples");
    EXPECT_EQ(t[1], 2);
    const std::string text = t[2].get<std::string>();
    EXPECT_NE(text.find(samples[0].at("prompt").get<std::string>()), std::string::npos) << text;
    EXPECT_NE(text.find("**advantage**"), std::string::npos) << text;
    ++texts;
  }
  EXPECT_EQ(texts, 1);
}

TEST(RolloutSamples, SeparatePoolsEachGetTheirCallsInTheTimeline) {
  hybridflow::testing::TempDir dir;
  RLTrainer trainer(load_rl_config(
      "", tiny_rl_overrides("gae", {"trainer.run_dir=" + dir.path(), "trainer.total_steps=1", "trainer.placement=split",
                                    "trainer.log_samples_freq=1", "trainer.log_samples_count=2",
                                    "algorithm.use_kl_in_reward=true"})));
  trainer.fit();
  const auto per_step = calls_per_step(read_jsonl(dir.path() + "/timeline.jsonl"));
  ASSERT_EQ(per_step.size(), 1u);
  const auto& calls = per_step.at(1);
  for (const char* call : {"actor actor.generate_sequences", "actor actor.compute_log_prob",
                           "actor actor.compute_ref_log_prob", "actor actor.update_actor",
                           "critic critic.compute_values", "critic critic.update_critic"})
    EXPECT_TRUE(calls.count(call)) << "lacks " << call;
  const auto samples = read_jsonl(dir.path() + "/samples.jsonl");
  ASSERT_EQ(samples.size(), 2u);
  for (const auto& s : samples)
    for (const char* key : {"score", "reward", "advantage"})
      EXPECT_TRUE(s.at(key).is_number() && std::isfinite(s.at(key).get<double>())) << key << " in " << s.dump();
}

double mean_score(const std::vector<nlohmann::json>& rows) {
  double total = 0;
  for (const auto& r : rows) total += r.at("score").get<double>();
  return total / static_cast<double>(rows.size());
}

// verl's trainer.rollout_data_dir and validation_data_dir: every generated row of a step, and of each
// validation, as one line of <dir>/<step>.jsonl; log_val_generations: the first held-out responses to the
// loggers at each validation.
TEST(GenerationDumps, EveryRolloutAndValidationRowInVerlsFormat) {
  hybridflow::testing::TempDir dir;
  const std::string rollouts = dir.path() + "/rollouts", validations = dir.path() + "/validations";
  RLTrainer trainer(load_rl_config(
      "", tiny_rl_overrides("grpo", {"trainer.run_dir=" + dir.path(), "trainer.total_steps=2", "trainer.test_freq=1",
                                     "data.test_size=3", "trainer.log_samples_freq=0",
                                     "trainer.rollout_data_dir=" + rollouts, "trainer.validation_data_dir=" + validations,
                                     "trainer.log_val_generations=2"})));
  const double before = trainer.evaluate(3);  // what `hybridflow train` runs first (val_before_train)
  trainer.fit();

  const auto metrics = read_jsonl(dir.path() + "/metrics.jsonl");
  ASSERT_EQ(metrics.size(), 2u);
  for (int64_t step = 1; step <= 2; ++step) {
    const auto rows = read_jsonl(rollouts + "/" + std::to_string(step) + ".jsonl");
    ASSERT_EQ(rows.size(), 4u) << "2 prompts x 2 responses";
    std::set<std::string> inputs;
    for (const auto& r : rows) {
      EXPECT_EQ(r.at("step"), step) << r.dump();
      EXPECT_NE(r.at("input").get<std::string>(), "") << r.dump();
      EXPECT_TRUE(r.at("output").is_string()) << r.dump();
      EXPECT_NE(r.at("gts").get<std::string>(), "") << r.dump();
      EXPECT_EQ(r.at("data_source"), "addition") << r.dump();
      EXPECT_EQ(r.at("reward"), r.at("score")) << "GRPO has no KL in the reward: " << r.dump();
      EXPECT_TRUE(r.at("advantage").is_number()) << r.dump();
      EXPECT_LE(r.at("response_length").get<int64_t>(), 4);
      inputs.insert(r.at("input").get<std::string>());
    }
    EXPECT_EQ(inputs.size(), 2u);
    // The rows are the batch the step trained on: their scores are the step's.
    const auto& m = metrics[static_cast<size_t>(step - 1)];
    EXPECT_NEAR(mean_score(rows), m.at("score/mean").get<double>(), 1e-12) << m.dump();

    const auto val = read_jsonl(validations + "/" + std::to_string(step) + ".jsonl");
    ASSERT_EQ(val.size(), 3u);
    EXPECT_NEAR(mean_score(val), m.at("val/score").get<double>(), 1e-12) << m.dump();
    for (const auto& r : val) {
      EXPECT_EQ(r.at("step"), step);
      EXPECT_FALSE(r.contains("advantage")) << "a validation row is not trained on: " << r.dump();
    }
  }
  const auto at_start = read_jsonl(validations + "/0.jsonl");
  ASSERT_EQ(at_start.size(), 3u);
  EXPECT_NEAR(mean_score(at_start), before, 1e-12);
  EXPECT_FALSE(std::filesystem::exists(rollouts + "/0.jsonl"));

  // Two per validation (steps 0, 1 and 2), always the same first held-out prompts.
  const auto logged = read_jsonl(dir.path() + "/val_generations.jsonl");
  ASSERT_EQ(logged.size(), 6u);
  for (size_t i = 0; i < logged.size(); ++i) {
    EXPECT_EQ(logged[i].at("step"), static_cast<int64_t>(i / 2));
    EXPECT_EQ(logged[i].at("input"), at_start[i % 2].at("input"));
  }
  const auto r = hybridflow::testing::run_report_script(
      "read_events.py", hybridflow::testing::shell_quote(dir.path() + "/tensorboard"), dir.path());
  ASSERT_EQ(r.exit_code, 0);
  const nlohmann::json events = nlohmann::json::parse(r.output);
  std::set<int64_t> text_steps;
  for (const auto& t : events.at("texts")) {
    EXPECT_EQ(t[0], "val_generations");
    text_steps.insert(t[1].get<int64_t>());
    EXPECT_NE(t[2].get<std::string>().find(at_start[0].at("input").get<std::string>()), std::string::npos);
  }
  EXPECT_EQ(text_steps, (std::set<int64_t>{0, 1, 2}));
}

// `hybridflow train`'s validations: val_before_train off scores only at the end; val_only scores once and
// trains nothing; val_only without held-out prompts names both keys.
TEST(GenerationDumps, ValBeforeTrainAndValOnly) {
  hybridflow::testing::TempDir a, b;
  ASSERT_EQ(run_rl_training(load_rl_config(
                "", tiny_rl_overrides("grpo", {"trainer.run_dir=" + a.path(), "trainer.total_steps=1",
                                               "trainer.val_before_train=false",
                                               "trainer.validation_data_dir=" + a.path() + "/val"}))),
            0);
  EXPECT_FALSE(std::filesystem::exists(a.path() + "/val/0.jsonl"));
  EXPECT_EQ(read_jsonl(a.path() + "/val/1.jsonl").size(), 4u) << "the score after training";
  const auto trained_only = read_jsonl(a.path() + "/metrics.jsonl");
  ASSERT_EQ(trained_only.size(), 1u);
  EXPECT_EQ(trained_only[0].at("step"), 1);

  ASSERT_EQ(run_rl_training(load_rl_config(
                "", tiny_rl_overrides("grpo", {"trainer.run_dir=" + b.path(), "trainer.val_only=true",
                                               "trainer.val_before_train=false",
                                               "trainer.validation_data_dir=" + b.path() + "/val"}))),
            0);
  EXPECT_EQ(read_jsonl(b.path() + "/val/0.jsonl").size(), 4u);
  EXPECT_FALSE(std::filesystem::exists(b.path() + "/val/1.jsonl"));
  // verl's val_only logs its validation at step 0, and nothing else.
  const auto val_only = read_jsonl(b.path() + "/metrics.jsonl");
  ASSERT_EQ(val_only.size(), 1u);
  EXPECT_EQ(val_only[0].at("step"), 0);
  EXPECT_NEAR(val_only[0].at("val/score").get<double>(), mean_score(read_jsonl(b.path() + "/val/0.jsonl")), 1e-12);
  EXPECT_FALSE(val_only[0].contains("score/mean")) << val_only[0].dump();

  // val_before_train (the default): the validation before the first step is the metrics record of step 0, with
  // verl's per-source metrics, then the steps; a resumed run logs no second step 0.
  hybridflow::testing::TempDir c;
  const std::vector<std::string> before = tiny_rl_overrides(
      "grpo", {"trainer.run_dir=" + c.path(), "trainer.total_steps=1", "trainer.save_freq=1",
               "trainer.validation_data_dir=" + c.path() + "/val"});
  ASSERT_EQ(run_rl_training(load_rl_config("", before)), 0);
  auto records = read_jsonl(c.path() + "/metrics.jsonl");
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].at("step"), 0);
  EXPECT_NEAR(records[0].at("val/score").get<double>(), mean_score(read_jsonl(c.path() + "/val/0.jsonl")), 1e-12);
  EXPECT_EQ(records[0].at("val-core/addition/reward/mean@1"), records[0].at("val/score")) << records[0].dump();
  EXPECT_EQ(records[1].at("step"), 1);
  std::vector<std::string> resumed = before;
  resumed.push_back("trainer.total_steps=2");
  ASSERT_EQ(run_rl_training(load_rl_config("", resumed)), 0);
  records = read_jsonl(c.path() + "/metrics.jsonl");
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].at("step"), 0);
  EXPECT_EQ(records[1].at("step"), 1);
  EXPECT_EQ(records[2].at("step"), 2);

  try {
    rl_run_spec(load_rl_config("", tiny_rl_overrides("grpo", {"trainer.val_only=true", "data.test_size=0"})));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("trainer.val_only"), std::string::npos) << what;
    EXPECT_NE(what.find("data.test_size"), std::string::npos) << what;
  }
}

// actor_rollout_ref.rollout.val_kwargs and verl's per-source validation metrics: held-out rows of two data
// sources, a scorer that gives source "a" 1 and source "b" a score from its response; greedy by default, n
// sampled responses with do_sample.
TEST(GenerationDumps, ValidationScoresEachDataSourceAndSamplesWithValKwargs) {
  hybridflow::testing::TempDir dir;
  std::vector<nlohmann::json> rows;
  for (int i = 0; i < 6; ++i)
    rows.push_back({{"data_source", i < 2 ? "a" : "b"},
                    {"prompt", std::to_string(i) + "+1="},
                    {"reward_model", {{"style", "rule"}, {"ground_truth", std::to_string(i + 1)}}}});
  write_jsonl(dir.file("test.jsonl"), rows);
  const std::string scorer =
      "reward.shell=/usr/bin/python3 -c \"import sys,json\nfor l in sys.stdin:\n  r = json.loads(l)\n  print(1.0 if "
      "r['data_source'] == 'a' else len(r['response']) % 3 / 2.0, flush=True)\"";
  auto run = [&](const std::string& name, std::vector<std::string> more) {
    more.insert(more.end(), {"data.test_file=" + dir.file("test.jsonl"), "data.test_size=6", "reward.type=command",
                             scorer, "trainer.test_freq=1", "trainer.total_steps=1", "trainer.log_samples_freq=0",
                             "trainer.validation_data_dir=" + dir.file(name)});
    RLTrainer trainer(load_rl_config("", tiny_rl_overrides("grpo", more)));
    const nlohmann::json record = trainer.step();
    return std::pair{record, read_jsonl(dir.file(name) + "/1.jsonl")};
  };

  const auto [greedy, greedy_rows] = run("greedy", {});
  ASSERT_EQ(greedy_rows.size(), 6u);
  double b_sum = 0;
  for (size_t i = 2; i < 6; ++i) b_sum += greedy_rows[i].at("score").get<double>();
  EXPECT_EQ(greedy.at("val-core/a/reward/mean@1"), 1.0) << greedy.dump();
  EXPECT_NEAR(greedy.at("val-core/b/reward/mean@1").get<double>(), b_sum / 4, 1e-12) << greedy.dump();
  EXPECT_NEAR(greedy.at("val/score").get<double>(), (2 + b_sum) / 6, 1e-12) << greedy.dump();
  EXPECT_FALSE(greedy.contains("val-core/b/reward/max@1")) << greedy.dump();

  const auto [sampled, sampled_rows] =
      run("sampled", {"actor_rollout_ref.rollout.val_kwargs.do_sample=true", "actor_rollout_ref.rollout.val_kwargs.n=4",
                      "actor_rollout_ref.rollout.val_kwargs.temperature=1.0"});
  ASSERT_EQ(sampled_rows.size(), 24u) << "4 responses to each of 6 prompts";
  double best = 0, worst = 0, sum = 0;
  std::set<std::string> outputs;
  for (size_t p = 2; p < 6; ++p) {
    double hi = -1, lo = 2;
    for (size_t j = 0; j < 4; ++j) {
      const auto& r = sampled_rows[p * 4 + j];
      EXPECT_EQ(r.at("input"), greedy_rows[p].at("input")) << "a prompt's responses are consecutive";
      const double score = r.at("score").get<double>();
      hi = std::max(hi, score);
      lo = std::min(lo, score);
      sum += score;
      outputs.insert(r.at("output").get<std::string>());
    }
    best += hi;
    worst += lo;
  }
  EXPECT_GT(outputs.size(), 4u) << "sampled, not greedy";
  EXPECT_NEAR(sampled.at("val-core/b/reward/mean@4").get<double>(), sum / 16, 1e-12) << sampled.dump();
  EXPECT_NEAR(sampled.at("val-core/b/reward/max@4").get<double>(), best / 4, 1e-12) << sampled.dump();
  EXPECT_NEAR(sampled.at("val-core/b/reward/min@4").get<double>(), worst / 4, 1e-12) << sampled.dump();
  EXPECT_EQ(sampled.at("val-core/a/reward/max@4"), 1.0);

  const std::string error = hybridflow::testing::error_of(
      [] { rl_run_spec(load_rl_config("", tiny_rl_overrides("grpo", {"actor_rollout_ref.rollout.val_kwargs.n=2"}))); });
  EXPECT_NE(error.find("actor_rollout_ref.rollout.val_kwargs.n is 2 but"), std::string::npos) << error;
}

// verl's data.train_files / val_files as lists (gsm8k and math in one run): the rows of every file, in one
// set, each keeping its data source; the held-out metrics per source.
TEST(GenerationDumps, SeveralDataFilesAreReadAsOneSet) {
  hybridflow::testing::TempDir dir;
  auto rows_of = [](const std::string& source, int first, int count) {
    std::vector<nlohmann::json> rows;
    for (int i = first; i < first + count; ++i)
      rows.push_back({{"data_source", source},
                      {"prompt", std::to_string(i) + "+1="},
                      {"reward_model", {{"style", "rule"}, {"ground_truth", std::to_string(i + 1)}}}});
    return rows;
  };
  write_jsonl(dir.file("x.jsonl"), rows_of("x", 0, 2));
  write_jsonl(dir.file("y.jsonl"), rows_of("y", 2, 2));
  write_jsonl(dir.file("hx.jsonl"), rows_of("hx", 4, 1));
  write_jsonl(dir.file("hy.jsonl"), rows_of("hy", 5, 2));
  RLTrainer trainer(load_rl_config(
      "", tiny_rl_overrides("grpo", {"data.train_files=[" + dir.file("x.jsonl") + "," + dir.file("y.jsonl") + "]",
                                     "data.val_files=[" + dir.file("hx.jsonl") + "," + dir.file("hy.jsonl") + "]",
                                     "data.train_batch_size=4", "data.test_size=3", "trainer.total_steps=1",
                                     "trainer.test_freq=1", "trainer.log_samples_freq=0",
                                     "trainer.rollout_data_dir=" + dir.file("rollouts"),
                                     "trainer.validation_data_dir=" + dir.file("validations")})));
  const nlohmann::json record = trainer.step();
  std::multiset<std::string> sources;
  for (const auto& r : read_jsonl(dir.file("rollouts") + "/1.jsonl")) sources.insert(r.at("data_source").get<std::string>());
  EXPECT_EQ(sources, (std::multiset<std::string>{"x", "x", "x", "x", "y", "y", "y", "y"})) << "4 prompts x 2 samples";
  const auto val = read_jsonl(dir.file("validations") + "/1.jsonl");
  ASSERT_EQ(val.size(), 3u);
  EXPECT_EQ(val[0].at("data_source"), "hx");
  EXPECT_EQ(val[2].at("data_source"), "hy");
  EXPECT_EQ(record.at("val-core/hx/reward/mean@1"), val[0].at("score")) << record.dump();
  EXPECT_NEAR(record.at("val-core/hy/reward/mean@1").get<double>(),
              (val[1].at("score").get<double>() + val[2].at("score").get<double>()) / 2, 1e-12) << record.dump();
  // A missing file among them is named.
  const std::string error = hybridflow::testing::error_of([&] {
    RLTrainer bad(load_rl_config("", tiny_rl_overrides("grpo", {"data.train_files=[" + dir.file("x.jsonl") + "," +
                                                                    dir.file("nope.jsonl") + "]"})));
  });
  EXPECT_NE(error.find("nope.jsonl"), std::string::npos) << error;
}

}  // namespace