#include <gtest/gtest.h>

#include "hybridflow/text/chat_template.h"

namespace hybridflow::text {
namespace {
TEST(ChatTemplate, Smoke) {
  EXPECT_EQ(JinjaTemplate::parse("{{ x }}").render({{"x", 1}}), "1");
}
}  // namespace
}  // namespace hybridflow::text
