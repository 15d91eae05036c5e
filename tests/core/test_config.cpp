#include "hybridflow/core/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "support/temp_dir.h"
#include "support/error_of.h"

namespace hybridflow {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const char* kDefaults = R"(
actor:
  optim:
    lr: 1.0e-6
    weight_decay: 0.01
    betas: [0.9, 0.999]
  ppo_epochs: 1
  use_kl_loss: false
  model_kwargs: {}
data:
  train_files: ???
  max_prompt_length: 512
  name: "gsm8k"
  shuffle_seed: null
trainer:
  total_steps: 100
  project: hybridflow
  tags: []
log:
  sinks: [console, jsonl]
)";

using hybridflow::testing::error_of;

Config load(const std::string& user_yaml, const std::vector<std::string>& overrides) {
  return Config::load_from_string(kDefaults, user_yaml, "run.yaml", overrides);
}

TEST(EditDistance, CountsInsertionsDeletionsSubstitutions) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("abc", ""), 3u);
  EXPECT_EQ(edit_distance("", "ab"), 2u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("actor.optim.lrr", "actor.optim.lr"), 1u);
  EXPECT_EQ(edit_distance("flaw", "lawn"), 2u);
  EXPECT_EQ(edit_distance("lawn", "flaw"), 2u);
}

TEST(Config, DefaultsFileAndOverridesMergeInOrder) {
  Config cfg = load("data:\n  train_files: [x.jsonl]\n  max_prompt_length: 256\nactor:\n  ppo_epochs: 4\n",
                    {"actor.optim.lr=1e-5", "trainer.total_steps=20", "actor.ppo_epochs=2"});
  EXPECT_DOUBLE_EQ(cfg.get<double>("actor.optim.lr"), 1e-5);
  EXPECT_DOUBLE_EQ(cfg.get<double>("actor.optim.weight_decay"), 0.01);
  EXPECT_EQ(cfg.get<int64_t>("trainer.total_steps"), 20);
  EXPECT_EQ(cfg.get<int>("data.max_prompt_length"), 256);  // file over default
  EXPECT_EQ(cfg.get<int64_t>("actor.ppo_epochs"), 2);       // override over file
  EXPECT_EQ(cfg.get<std::string>("data.name"), "gsm8k");
  EXPECT_FALSE(cfg.get<bool>("actor.use_kl_loss"));
  EXPECT_EQ(cfg.get<std::vector<std::string>>("data.train_files"), std::vector<std::string>{"x.jsonl"});
  EXPECT_EQ(cfg.get<std::vector<double>>("actor.optim.betas"), (std::vector<double>{0.9, 0.999}));
  EXPECT_TRUE(cfg.is_null("data.shuffle_seed"));
  EXPECT_EQ(cfg.get_or<int64_t>("data.shuffle_seed", 7), 7);
  EXPECT_TRUE(cfg.has("actor.optim"));
  EXPECT_FALSE(cfg.has("actor.optim.momentum"));
}

TEST(Config, OverrideSyntaxForListsBoolsNullsAndOpenMaps) {
  Config cfg = load("", {"data.train_files=[a.jsonl,b.jsonl]", "actor.use_kl_loss=true", "data.shuffle_seed=3",
                         "trainer.tags=[ppo, 'gsm 8k']", "+actor.model_kwargs.rope_theta=10000",
                         "actor.model_kwargs.dropout=0.1", "trainer.project=run#1: x", "data.name=123"});
  EXPECT_EQ(cfg.get<std::vector<std::string>>("data.train_files"),
            (std::vector<std::string>{"a.jsonl", "b.jsonl"}));
  EXPECT_TRUE(cfg.get<bool>("actor.use_kl_loss"));
  EXPECT_EQ(cfg.get<int64_t>("data.shuffle_seed"), 3);
  EXPECT_EQ(cfg.get<std::vector<std::string>>("trainer.tags"), (std::vector<std::string>{"ppo", "gsm 8k"}));
  EXPECT_EQ(cfg.get<int64_t>("actor.model_kwargs.rope_theta"), 10000);
  EXPECT_DOUBLE_EQ(cfg.get<double>("actor.model_kwargs.dropout"), 0.1);
  EXPECT_EQ(cfg.get<std::string>("trainer.project"), "run#1: x");  // taken literally
  EXPECT_EQ(cfg.get<std::string>("data.name"), "123");             // a string key keeps digits as text
  Config cleared = load("data:\n  train_files: [a]\n  shuffle_seed: 5\n", {"data.shuffle_seed=null"});
  EXPECT_TRUE(cleared.is_null("data.shuffle_seed"));
}

TEST(Config, UnknownKeyInFileNamesFileLineAndSuggestion) {
  std::string msg = error_of([] { load("data:\n  train_files: [a]\nactor:\n  optim:\n    lrr: 0.1\n", {}); });
  EXPECT_THAT(msg, HasSubstr("unknown config key 'actor.optim.lrr'"));
  EXPECT_THAT(msg, HasSubstr("run.yaml:5:5"));
  EXPECT_THAT(msg, HasSubstr("did you mean 'actor.optim.lr'?"));
}

TEST(Config, UnknownKeyOnCommandLineNamesItAndSuggestion) {
  std::string msg = error_of([] { load("", {"data.train_files=[a]", "trainer.total_step=5"}); });
  EXPECT_THAT(msg, HasSubstr("unknown config key 'trainer.total_step'"));
  EXPECT_THAT(msg, HasSubstr("command line: trainer.total_step=5"));
  EXPECT_THAT(msg, HasSubstr("did you mean 'trainer.total_steps'?"));
  // Nothing close: list the valid keys at that level instead of a misleading guess.
  std::string far = error_of([] { load("", {"data.train_files=[a]", "trainer.zzzzzzzzzzzz=1"}); });
  EXPECT_THAT(far, Not(HasSubstr("did you mean")));
  EXPECT_THAT(far, HasSubstr("valid keys here: total_steps, project, tags"));
  EXPECT_THAT(error_of([] { load("", {"nokey"}); }), HasSubstr("must look like key=value"));
  EXPECT_THAT(error_of([] { load("", {"trainer.total_steps.x=1"}); }),
              HasSubstr("'trainer.total_steps' is not a map"));
}

TEST(Config, WrongTypeNamesKeyExpectedTypeAndValue) {
  std::string msg = error_of([] { load("data:\n  train_files: [a]\n", {"trainer.total_steps=abc"}); });
  EXPECT_THAT(msg, HasSubstr("config key 'trainer.total_steps' expects an integer, got 'abc'"));
  EXPECT_THAT(msg, HasSubstr("command line"));
  msg = error_of([] { load("data:\n  train_files: [a]\nactor:\n  optim:\n    lr: fast\n", {}); });
  EXPECT_THAT(msg, HasSubstr("'actor.optim.lr' expects a number, got 'fast' (run.yaml:5:9)"));
  EXPECT_THAT(error_of([] { load("data:\n  train_files: [a]\n", {"actor.use_kl_loss=yes"}); }),
              HasSubstr("expects a boolean (true/false), got 'yes'"));
  EXPECT_THAT(error_of([] { load("data:\n  train_files: [a]\n", {"trainer.total_steps=1.5"}); }),
              HasSubstr("expects an integer, got '1.5'"));
  EXPECT_THAT(error_of([] { load("data:\n  train_files: [a]\n", {"trainer.tags=ppo"}); }),
              HasSubstr("'trainer.tags' expects a list, got 'ppo'"));
  EXPECT_THAT(error_of([] { load("data:\n  train_files: [a]\n", {"actor.optim.betas=[0.9, high]"}); }),
              HasSubstr("'actor.optim.betas[1]' expects a number, got 'high'"));
  EXPECT_THAT(error_of([] { load("data:\n  train_files: [a]\nactor: 3\n", {}); }),
              HasSubstr("'actor' expects a map, got '3'"));
  // One text where a list of texts is expected is a list of one (verl's trainer.logger=console); not a number,
  // nor where the default list is empty and says nothing of its items.
  EXPECT_EQ(load("data:\n  train_files: [a]\n", {"log.sinks=tensorboard"}).get<std::vector<std::string>>("log.sinks"),
            std::vector<std::string>{"tensorboard"});
  EXPECT_EQ(load("data:\n  train_files: [a]\nlog:\n  sinks: console\n", {}).get<std::vector<std::string>>("log.sinks"),
            std::vector<std::string>{"console"});
  EXPECT_THAT(error_of([] { load("data:\n  train_files: [a]\n", {"log.sinks=3"}); }), HasSubstr("'log.sinks' expects a list, got '3'"));
  EXPECT_THAT(error_of([] { load("data:\n  train_files: [a]\n", {"actor.optim.betas=0.9"}); }), HasSubstr("'actor.optim.betas' expects a list"));
  // An int where a float is expected is fine.
  EXPECT_DOUBLE_EQ(load("data:\n  train_files: [a]\n", {"actor.optim.lr=1"}).get<double>("actor.optim.lr"), 1.0);
}

TEST(Config, MissingRequiredKeyIsNamed) {
  std::string msg = error_of([] { load("", {}); });
  EXPECT_THAT(msg, HasSubstr("missing required config key 'data.train_files'"));
  EXPECT_THAT(msg, HasSubstr("data.train_files=..."));
}

TEST(Config, TypedAccessErrors) {
  Config cfg = load("", {"data.train_files=[a]"});
  std::string msg = error_of([&] { cfg.get<double>("actor.optim.lrr"); });
  EXPECT_THAT(msg, HasSubstr("no config key 'actor.optim.lrr'"));
  EXPECT_THAT(msg, HasSubstr("did you mean 'actor.optim.lr'?"));
  EXPECT_THAT(error_of([&] { cfg.get<int64_t>("data.name"); }),
              HasSubstr("'data.name' expects an integer, got 'gsm8k' (defaults:"));
  EXPECT_THAT(error_of([&] { cfg.get<std::string>("actor"); }), HasSubstr("'actor' expects a string, got a map"));
}

TEST(Config, SubtreeKeepsFullKeysInErrors) {
  Config cfg = load("", {"data.train_files=[a]"});
  Config optim = cfg.subtree("actor").subtree("optim");
  EXPECT_EQ(optim.prefix(), "actor.optim");
  EXPECT_DOUBLE_EQ(optim.get<double>("lr"), 1e-6);
  EXPECT_EQ(optim.keys(), (std::vector<std::string>{"lr", "weight_decay", "betas"}));
  EXPECT_THAT(error_of([&] { optim.get<double>("lrr"); }),
              HasSubstr("'actor.optim.lrr'; did you mean 'actor.optim.lr'"));
  EXPECT_THAT(error_of([&] { cfg.subtree("trainer.total_steps"); }), HasSubstr("expects a map"));
}

TEST(Config, ToYamlRoundTripsThroughLoad) {
  Config cfg = load("", {"data.train_files=[a.jsonl, b.jsonl]", "data.name=123", "trainer.project=true",
                         "actor.optim.lr=3e-4", "+actor.model_kwargs.flag=on"});
  std::string yaml = cfg.to_yaml();
  Config again = Config::load_from_string(kDefaults, yaml, "saved.yaml", {});
  EXPECT_EQ(again.to_yaml(), yaml);
  EXPECT_THAT(yaml, HasSubstr("name: \"123\""));  // quoted, so it stays a string when loaded again
  EXPECT_EQ(again.get<std::string>("data.name"), "123");
  EXPECT_EQ(again.get<std::string>("trainer.project"), "true");
  EXPECT_DOUBLE_EQ(again.get<double>("actor.optim.lr"), 3e-4);
  EXPECT_EQ(again.get<std::vector<std::string>>("data.train_files"),
            (std::vector<std::string>{"a.jsonl", "b.jsonl"}));
  EXPECT_EQ(again.get<std::string>("actor.model_kwargs.flag"), "on");
}

TEST(Config, LoadsUserFileFromDisk) {
  testing::TempDir dir;
  std::string path = dir.file("cfg.yaml");
  write_file_atomic(path, "data:\n  train_files: [d.jsonl]\ntrainer:\n  total_steps: nope\n");
  std::string msg = error_of([&] { Config::load(kDefaults, path, {}); });
  EXPECT_THAT(msg, HasSubstr(path + ":4:16"));
  write_file_atomic(path, "data:\n  train_files: [d.jsonl\n");
  EXPECT_THAT(error_of([&] { Config::load(kDefaults, path, {}); }), HasSubstr("invalid YAML"));
  write_file_atomic(path, "data:\n  train_files: [d.jsonl]\n");
  EXPECT_EQ(Config::load(kDefaults, path, {"trainer.total_steps=3"}).get<int64_t>("trainer.total_steps"), 3);
  EXPECT_THROW(Config::load(kDefaults, dir.file("missing.yaml"), {}), Error);
  EXPECT_EQ(Config::load(kDefaults, "", {"data.train_files=[x]"}).get<int64_t>("trainer.total_steps"), 100);
}

}  // namespace
}  // namespace hybridflow
