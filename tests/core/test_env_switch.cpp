// env_switch: on/1, off/0, unset or empty (the default either way), and a misspelt value an error naming the
// variable and what it switches.
#include "hybridflow/core/env_switch.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace hybridflow {
namespace {

constexpr const char* kName = "HF_TEST_ENV_SWITCH";

TEST(EnvSwitch, OnOffAndTheDefault) {
  for (bool unset : {false, true}) {
    unsetenv(kName);
    EXPECT_EQ(env_switch(kName, unset, "a test"), unset);
    setenv(kName, "", 1);
    EXPECT_EQ(env_switch(kName, unset, "a test"), unset);
    for (const char* on : {"on", "1"}) {
      setenv(kName, on, 1);
      EXPECT_TRUE(env_switch(kName, unset, "a test")) << on;
    }
    for (const char* off : {"off", "0"}) {
      setenv(kName, off, 1);
      EXPECT_FALSE(env_switch(kName, unset, "a test")) << off;
    }
  }
  setenv(kName, "of", 1);
  try {
    env_switch(kName, true, "a test");
    ADD_FAILURE() << "'of' accepted";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(kName), std::string::npos) << what;
    EXPECT_NE(what.find("a test"), std::string::npos) << what;
    EXPECT_NE(what.find("'of'"), std::string::npos) << what;
  }
  unsetenv(kName);
}

}  // namespace
}  // namespace hybridflow
