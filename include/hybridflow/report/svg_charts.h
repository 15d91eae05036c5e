// Inline SVG charts generated in C++ for the HTML run report: line charts, stacked bars and a Gantt
// timeline, each with a title, axes with tick labels, and a legend when there are several series.
// All text is escaped, so metric and pool names cannot inject markup.
#pragma once

#include <string>
#include <vector>

namespace hybridflow::report {

struct LineSeries {
  std::string name;
  std::vector<double> x, y;  // finite values only
};

struct LineChartOptions {
  std::string title;
  std::string x_label = "step";
  std::string y_label;
  int width = 640, height = 280;
  size_t max_points = 600;  // per series, after min/max downsampling
  // Exponential-moving-average weight of an extra smoothed line (the raw line is then drawn faint);
  // negative picks one from the series length, 0 turns smoothing off.
  double smoothing = -1;
};

// One <polyline> per series (two with smoothing: raw first, then smoothed), dots on short series.
std::string line_chart_svg(const std::vector<LineSeries>& series, const LineChartOptions& options);

struct StackedBarChart {
  std::string title, y_label, x_label = "step";
  std::vector<double> x;                   // one bar per x
  std::vector<std::string> layer_names;    // bottom to top
  std::vector<std::vector<double>> layers; // layers[l][i]: the height of layer l in bar i (>= 0)
  int width = 640, height = 280;
};

std::string stacked_bar_chart_svg(const StackedBarChart& chart);

struct GanttSpan {
  std::string row, label;  // row: a worker pool; label: the call
  double start = 0, end = 0;
};

struct GanttMarker {
  double x = 0;
  std::string label;  // e.g. "step 12", drawn at the top of a dashed vertical line
};

struct GanttChart {
  std::string title, x_label = "seconds";
  std::vector<GanttSpan> spans;
  std::vector<GanttMarker> markers;
  int width = 1280;
};

// Rows in order of first appearance; one colour per label, with a legend.
std::string gantt_chart_svg(const GanttChart& chart);

}  // namespace hybridflow::report
