// Axis ticks, tick labels, downsampling and smoothing of the report's SVG charts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "hybridflow/report/chart_scale.h"
#include "hybridflow/report/downsample.h"
#include "hybridflow/report/svg_charts.h"

namespace hybridflow::report {
namespace {

TEST(NiceTicks, CoverTheRangeWithRoundSteps) {
  const AxisTicks t = nice_ticks(0.07, 0.93, 5);
  EXPECT_DOUBLE_EQ(t.step, 0.2);
  EXPECT_DOUBLE_EQ(t.lo, 0.0);
  EXPECT_DOUBLE_EQ(t.hi, 1.0);
  EXPECT_EQ(t.values.size(), 6u);
  const AxisTicks steps = nice_ticks(1, 300, 6);
  EXPECT_DOUBLE_EQ(steps.step, 50);
  EXPECT_DOUBLE_EQ(steps.lo, 0);
  EXPECT_DOUBLE_EQ(steps.hi, 300);
}

TEST(NiceTicks, ConstantAndNegativeRanges) {
  const AxisTicks c = nice_ticks(2e-4, 2e-4, 5);  // a constant learning rate
  EXPECT_LT(c.lo, 2e-4);
  EXPECT_GT(c.hi, 2e-4);
  const AxisTicks z = nice_ticks(0, 0, 5);
  EXPECT_LT(z.lo, 0);
  EXPECT_GT(z.hi, 0);
  const AxisTicks n = nice_ticks(-0.1, 0.4, 5);
  EXPECT_DOUBLE_EQ(n.lo, -0.1);
  for (double v : n.values) EXPECT_FALSE(std::signbit(v) && v == 0) << "negative zero tick";
}

TEST(FormatTick, DecimalsFollowTheStep) {
  EXPECT_EQ(format_tick(0.4, 0.2), "0.4");
  EXPECT_EQ(format_tick(150, 50), "150");
  EXPECT_EQ(format_tick(0.25, 0.05), "0.25");
  EXPECT_EQ(format_tick(0, 2e-6), "0");
  EXPECT_EQ(format_tick(4e-6, 2e-6), "4e-06");
  EXPECT_EQ(format_tick(2e9, 5e8), "2e+09");
}

TEST(Downsample, ShortSeriesUnchangedLongOnesKeepExtremes) {
  const std::vector<double> x = {1, 2, 3}, y = {3, 1, 2};
  const XY same = downsample_min_max(x, y, 10);
  EXPECT_EQ(same.x, x);
  EXPECT_EQ(same.y, y);
  std::vector<double> lx, ly;
  for (int i = 0; i < 10000; ++i) {
    lx.push_back(i);
    ly.push_back(i == 4321 ? -50.0 : i == 7777 ? 80.0 : std::sin(i * 0.01));
  }
  const XY d = downsample_min_max(lx, ly, 600);
  EXPECT_LE(d.x.size(), 600u);
  EXPECT_EQ(*std::min_element(d.y.begin(), d.y.end()), -50.0);
  EXPECT_EQ(*std::max_element(d.y.begin(), d.y.end()), 80.0);
  EXPECT_TRUE(std::is_sorted(d.x.begin(), d.x.end()));
  EXPECT_EQ(d.x.front(), 0);
  EXPECT_EQ(d.x.back(), 9999);
}

TEST(SmoothEma, DebiasedFromTheFirstPoint) {
  const std::vector<double> s = smooth_ema({5, 5, 5}, 0.9);
  for (double v : s) EXPECT_NEAR(v, 5, 1e-12);  // a constant stays constant: no pull toward zero
  EXPECT_EQ(smooth_ema({1, 2}, 0).back(), 2);
}

TEST(LineChart, EmptyAndSinglePointSeriesDrawWithoutNaN) {
  LineChartOptions o;
  o.title = "t";
  const std::string empty = line_chart_svg({{"a", {}, {}}}, o);
  EXPECT_EQ(empty.find("nan"), std::string::npos);
  const std::string one = line_chart_svg({{"a", {7}, {0.5}}}, o);
  EXPECT_EQ(one.find("nan"), std::string::npos);
  EXPECT_NE(one.find("<circle"), std::string::npos);
}

TEST(GanttChart, EscapesNamesAndDrawsEverySpan) {
  GanttChart g;
  g.title = "timeline";
  g.spans = {{"pool<1>", "gen&erate", 0, 1}, {"pool<1>", "update", 1, 3}, {"critic", "values", 0.5, 0.7}};
  g.markers = {{0, "step 1"}};
  const std::string svg = gantt_chart_svg(g);
  EXPECT_NE(svg.find("pool&lt;1&gt;"), std::string::npos);
  EXPECT_EQ(svg.find("pool<1>"), std::string::npos);
  size_t rects = 0;
  for (size_t at = svg.find("<rect"); at != std::string::npos; at = svg.find("<rect", at + 1)) ++rects;
  EXPECT_EQ(rects, 3u + 3u);  // three spans, three legend swatches
}

}  // namespace
}  // namespace hybridflow::report
