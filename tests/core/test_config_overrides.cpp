// Command-line overrides in Hydra's forms: key=null, key= (empty string), +key (add), ++key (set or add).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "hybridflow/core/config.h"
#include "support/error_of.h"

namespace hybridflow {
namespace {

using ::testing::HasSubstr;
using hybridflow::testing::error_of;

const char* kDefaults = R"(
model:
  name: "base"
  layers: 2
  kwargs: {}
run:
  tag: null
)";

Config load(const std::vector<std::string>& overrides, const std::string& user = "") {
  return Config::load_from_string(kDefaults, user, "run.yaml", overrides);
}

TEST(ConfigOverrides, EmptyValueIsTheEmptyStringAndNullIsNull) {
  Config cfg = load({"model.name=", "run.tag="});
  EXPECT_EQ(cfg.get<std::string>("model.name"), "");
  EXPECT_FALSE(cfg.is_null("run.tag"));
  EXPECT_EQ(cfg.get<std::string>("run.tag"), "");
  EXPECT_TRUE(load({"run.tag=null"}).is_null("run.tag"));
  // An integer key has no empty-string value: the error names key and value.
  EXPECT_THAT(error_of([] { load({"model.layers="}); }), HasSubstr("'model.layers' expects an integer, got ''"));
}

TEST(ConfigOverrides, PlusAddsAKeyOnlyWhereAnOpenMapAllowsIt) {
  Config cfg = load({"+model.kwargs.rope_theta=10000", "+model.kwargs.nested.depth=2"});
  EXPECT_EQ(cfg.get<int64_t>("model.kwargs.rope_theta"), 10000);
  EXPECT_EQ(cfg.get<int64_t>("model.kwargs.nested.depth"), 2);
  // Hydra's "+" never overwrites: a schema key, or one the file already added, exists.
  EXPECT_THAT(error_of([] { load({"+model.layers=3"}); }),
              HasSubstr("'+model.layers=...' adds a key, but config key 'model.layers' already exists"));
  EXPECT_THAT(error_of([] { load({"+model.kwargs.a=1"}, "model:\n  kwargs:\n    a: 0\n"); }),
              HasSubstr("already exists"));
  // A fixed map takes no new keys.
  const std::string fixed = error_of([] { load({"+model.depth=3"}); });
  EXPECT_THAT(fixed, HasSubstr("cannot add config key"));
  EXPECT_THAT(fixed, HasSubstr("'model.depth'"));
}

TEST(ConfigOverrides, DoublePlusSetsOrAdds) {
  Config cfg = load({"++model.layers=4", "++model.kwargs.dropout=0.1"}, "model:\n  kwargs:\n    dropout: 0.0\n");
  EXPECT_EQ(cfg.get<int64_t>("model.layers"), 4);
  EXPECT_DOUBLE_EQ(cfg.get<double>("model.kwargs.dropout"), 0.1);
  EXPECT_EQ(load({"++model.kwargs.fresh=x"}).get<std::string>("model.kwargs.fresh"), "x");
  EXPECT_THAT(error_of([] { load({"++model.depth=3"}); }), HasSubstr("unknown config key 'model.depth'"));
}

TEST(ConfigOverrides, OriginTellsDefaultsFromUserValues) {
  Config cfg = load({"model.layers=3"}, "run:\n  tag: a\n");
  EXPECT_TRUE(cfg.is_default("model.name"));
  EXPECT_FALSE(cfg.is_default("model.layers"));
  EXPECT_EQ(cfg.origin("model.layers"), "command line: model.layers=3");
  EXPECT_EQ(cfg.origin("run.tag"), "run.yaml:2:8");
}

}  // namespace
}  // namespace hybridflow
