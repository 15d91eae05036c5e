// KeyCompat: another tool's key names read as the schema's (aliases), or accepted and dropped.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "hybridflow/core/config.h"
#include "support/error_of.h"

namespace hybridflow {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using hybridflow::testing::error_of;

const char* kDefaults = R"(
model:
  path: ""
data:
  train_file: ""
trainer:
  total_steps: 10
  extra: {}
)";

KeyCompat compat() {
  KeyCompat c;
  c.aliases = {{"actor.model.path", "model.path"},
               {"data.train_files", "data.train_file"},
               {"trainer.total_training_steps", "trainer.total_steps"},
               {"trainer.gone", "trainer.not_in_schema"}};
  c.ignored = {{"actor.strategy", "fsdp|megatron", "our engine runs it"},
               {"actor.fsdp_config", "", ""},
               {"**._target_", "", ""}};
  return c;
}

Config load(const std::string& user, const std::vector<std::string>& overrides, CompatReport* report) {
  return Config::load_from_string(kDefaults, user, "verl.yaml", overrides, compat(), report);
}

TEST(ConfigCompat, AliasesSetTheSchemaKeyFromFileAndCommandLine) {
  CompatReport report;
  Config cfg = load("actor:\n  model:\n    path: /m\ndata:\n  train_files: [a.parquet]\n",
                    {"trainer.total_training_steps=3"}, &report);
  EXPECT_EQ(cfg.get<std::string>("model.path"), "/m");
  EXPECT_EQ(cfg.get<std::string>("data.train_file"), "a.parquet");  // a list of one file is that file
  EXPECT_EQ(cfg.get<int64_t>("trainer.total_steps"), 3);
  EXPECT_EQ(cfg.origin("model.path"), "verl.yaml:3:11");
  EXPECT_EQ(report.renamed.size(), 3u);
  EXPECT_TRUE(report.ignored.empty());
  // The target's type is checked under the alias's value, and null keeps the default.
  EXPECT_THAT(error_of([] { load("", {"trainer.total_training_steps=many"}, nullptr); }),
              HasSubstr("'trainer.total_steps' expects an integer, got 'many'"));
  EXPECT_EQ(load("trainer:\n  total_training_steps: null\n", {}, nullptr).get<int64_t>("trainer.total_steps"), 10);
  Config unset = load("trainer:\n  total_training_steps: 4\n", {"trainer.total_training_steps=null"}, nullptr);
  EXPECT_EQ(unset.get<int64_t>("trainer.total_steps"), 10);
  EXPECT_TRUE(unset.is_default("trainer.total_steps"));
}

TEST(ConfigCompat, IgnoredKeysAreReportedLeafByLeafAndValuesChecked) {
  CompatReport report;
  load("actor:\n  strategy: FSDP\n  fsdp_config:\n    param_offload: true\n    wrap_policy: {min_num_params: 0}\n"
       "trainer:\n  _target_: x.Y\n",
       {"actor.fsdp_config.param_offload=false"}, &report);
  EXPECT_THAT(report.ignored, ElementsAre("actor.strategy", "actor.fsdp_config.param_offload",
                                          "actor.fsdp_config.wrap_policy.min_num_params", "trainer._target_"));
  const std::string refused = error_of([] { load("actor:\n  strategy: deepspeed\n", {}, nullptr); });
  EXPECT_THAT(refused, HasSubstr("config key 'actor.strategy' = 'deepspeed' (verl.yaml:2:13) is not supported"));
  EXPECT_THAT(refused, HasSubstr("fsdp, megatron (our engine runs it)"));
}

TEST(ConfigCompat, KeysUnknownToBothStayErrorsNamingTheKey) {
  // Inside a map the compat table knows (actor.*), and outside it.
  EXPECT_THAT(error_of([] { load("actor:\n  model:\n    paht: /m\n", {}, nullptr); }),
              HasSubstr("unknown config key 'actor.model.paht' (verl.yaml:3:5)"));
  EXPECT_THAT(error_of([] { load("", {"trainer.totl_steps=2"}, nullptr); }),
              HasSubstr("unknown config key 'trainer.totl_steps'"));
  // An alias whose target the schema lacks is skipped: the key is unknown.
  EXPECT_THAT(error_of([] { load("", {"trainer.gone=1"}, nullptr); }), HasSubstr("unknown config key 'trainer.gone'"));
  // Without a compat table, verl's names are plain unknown keys.
  EXPECT_THAT(error_of([] { Config::load_from_string(kDefaults, "", "", {"actor.strategy=fsdp"}); }),
              HasSubstr("unknown config key 'actor'"));
}

TEST(ConfigCompat, NullKeepsTheDefaultOnlyWhenAsked) {
  KeyCompat c = compat();
  c.null_keeps_default = true;  // verl writes null for "unset"
  Config cfg = Config::load_from_string(kDefaults, "trainer:\n  total_steps: null\n", "verl.yaml", {}, c, nullptr);
  EXPECT_EQ(cfg.get<int64_t>("trainer.total_steps"), 10);
  EXPECT_THAT(error_of([] { load("trainer:\n  total_steps: null\n", {}, nullptr); }),
              HasSubstr("'trainer.total_steps' expects an integer, got null"));
}

}  // namespace
}  // namespace hybridflow
