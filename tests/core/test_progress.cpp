#include <gtest/gtest.h>

#include "hybridflow/core/progress.h"

namespace hybridflow {

TEST(ProgressLine, FormatsDurations) {
  EXPECT_EQ(ProgressLine::format_duration(5.2), "5s");
  EXPECT_EQ(ProgressLine::format_duration(65), "1m05s");
  EXPECT_EQ(ProgressLine::format_duration(3 * 3600 + 120), "3h02m");
  EXPECT_EQ(ProgressLine::format_duration(-1), "?");
}

TEST(ProgressLine, RenderShowsStepFiguresAndEta) {
  ProgressLine line("sft", 100);
  std::string text = line.render(10, {{"loss", 1.25}, {"lr", 0.001}});
  EXPECT_NE(text.find("sft step 10/100"), std::string::npos) << text;
  EXPECT_NE(text.find("loss 1.25"), std::string::npos) << text;
  EXPECT_NE(text.find("lr 0.001"), std::string::npos) << text;
  EXPECT_NE(text.find("ETA"), std::string::npos) << text;
}

}  // namespace hybridflow
