#include "hybridflow/report/svg_charts.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "hybridflow/report/chart_scale.h"
#include "hybridflow/report/downsample.h"
#include "hybridflow/report/html_escape.h"

namespace hybridflow::report {
namespace {

constexpr int kLeft = 64, kRight = 16, kBottom = 44, kTitleHeight = 26, kLegendRowHeight = 18;
constexpr double kLegendCharWidth = 6.6;  // at font-size 11, for laying out legend entries

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// Legend entries laid out left to right, wrapping; returns the SVG and sets `rows`.
std::string legend_svg(const std::vector<std::string>& names, int x0, int y0, int width, int& rows) {
  std::string out;
  rows = 0;
  if (names.size() < 2) return out;
  rows = 1;
  double x = x0;
  for (size_t i = 0; i < names.size(); ++i) {
    const double w = 18 + kLegendCharWidth * static_cast<double>(names[i].size()) + 14;
    if (x + w > x0 + width && x > x0) {
      x = x0;
      ++rows;
    }
    const double y = y0 + (rows - 1) * kLegendRowHeight;
    out += "<rect x=\"" + fmt(x) + "\" y=\"" + fmt(y - 9) + "\" width=\"12\" height=\"10\" fill=\"" +
           series_color(i) + "\"/>";
    out += "<text x=\"" + fmt(x + 16) + "\" y=\"" + fmt(y) + "\" class=\"legend\">" + html_escape(names[i]) + "</text>";
    x += w;
  }
  return out;
}

// The title, legend, plot frame, grid and tick labels of a chart with numeric x and y axes. `top` is
// where the plot area starts (below title and legend).
struct Frame {
  int width = 0, height = 0, top = 0;
  AxisTicks xt, yt;

  double px(double x) const { return kLeft + (x - xt.lo) / (xt.hi - xt.lo) * (width - kLeft - kRight); }
  double py(double y) const { return height - kBottom - (y - yt.lo) / (yt.hi - yt.lo) * (height - kBottom - top); }

  std::string begin(const std::string& title, const std::vector<std::string>& legend) {
    std::string out = "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" viewBox=\"0 0 " +
                      std::to_string(width) + " " + std::to_string(height) + "\" width=\"" + std::to_string(width) +
                      "\" height=\"" + std::to_string(height) + "\" role=\"img\">";
    out += "<title>" + html_escape(title) + "</title>";
    out += "<text x=\"" + std::to_string(kLeft) + "\" y=\"18\" class=\"title\">" + html_escape(title) + "</text>";
    int rows = 0;
    const std::string legend_svg_text = legend_svg(legend, kLeft, kTitleHeight + 12, width - kLeft - kRight, rows);
    out += legend_svg_text;
    top = kTitleHeight + 10 + rows * kLegendRowHeight;
    return out;
  }

  std::string axes(const std::string& x_label, const std::string& y_label, bool x_ticks = true) const {
    std::string out;
    const double left = kLeft, right = width - kRight, bottom = height - kBottom;
    for (double v : yt.values) {
      const double y = py(v);
      out += "<line x1=\"" + fmt(left) + "\" y1=\"" + fmt(y) + "\" x2=\"" + fmt(right) + "\" y2=\"" + fmt(y) +
             "\" class=\"grid\"/>";
      out += "<text x=\"" + fmt(left - 6) + "\" y=\"" + fmt(y + 4) + "\" class=\"ytick\">" + format_tick(v, yt.step) +
             "</text>";
    }
    if (x_ticks) {
      for (double v : xt.values) {
        const double x = px(v);
        out += "<line x1=\"" + fmt(x) + "\" y1=\"" + fmt(bottom) + "\" x2=\"" + fmt(x) + "\" y2=\"" + fmt(bottom + 4) +
               "\" class=\"axis\"/>";
        out += "<text x=\"" + fmt(x) + "\" y=\"" + fmt(bottom + 17) + "\" class=\"xtick\">" + format_tick(v, xt.step) +
               "</text>";
      }
    }
    out += "<line x1=\"" + fmt(left) + "\" y1=\"" + fmt(bottom) + "\" x2=\"" + fmt(right) + "\" y2=\"" + fmt(bottom) +
           "\" class=\"axis\"/>";
    out += "<line x1=\"" + fmt(left) + "\" y1=\"" + std::to_string(top) + "\" x2=\"" + fmt(left) + "\" y2=\"" +
           fmt(bottom) + "\" class=\"axis\"/>";
    out += "<text x=\"" + fmt((left + right) / 2) + "\" y=\"" + fmt(height - 6.0) + "\" class=\"xlabel\">" +
           html_escape(x_label) + "</text>";
    if (!y_label.empty()) {
      const double cy = (top + bottom) / 2;
      out += "<text x=\"14\" y=\"" + fmt(cy) + "\" class=\"ylabel\" transform=\"rotate(-90 14 " + fmt(cy) + ")\">" +
             html_escape(y_label) + "</text>";
    }
    return out;
  }
};

std::string polyline(const Frame& f, const std::vector<double>& x, const std::vector<double>& y, const char* color,
                     const char* css_class) {
  std::string points;
  for (size_t i = 0; i < x.size(); ++i) {
    if (i > 0) points += ' ';
    points += fmt(f.px(x[i])) + "," + fmt(f.py(y[i]));
  }
  return std::string("<polyline class=\"") + css_class + "\" stroke=\"" + color + "\" points=\"" + points + "\"/>";
}

}  // namespace

std::string line_chart_svg(const std::vector<LineSeries>& series, const LineChartOptions& options) {
  Frame f;
  f.width = options.width;
  f.height = options.height;
  double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
  std::vector<std::string> names;
  for (const auto& s : series) {
    names.push_back(s.name);
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      xlo = std::min(xlo, s.x[i]);
      xhi = std::max(xhi, s.x[i]);
      ylo = std::min(ylo, s.y[i]);
      yhi = std::max(yhi, s.y[i]);
    }
  }
  if (!std::isfinite(xlo)) xlo = xhi = ylo = yhi = 0;
  f.xt = nice_ticks(xlo, xhi, 6);
  f.yt = nice_ticks(ylo, yhi, 5);
  std::string out = f.begin(options.title, names);
  out += f.axes(options.x_label, options.y_label);
  for (size_t k = 0; k < series.size(); ++k) {
    const auto& s = series[k];
    const XY d = downsample_min_max(s.x, s.y, options.max_points);
    const size_t n = std::min(s.x.size(), s.y.size());
    const double weight = options.smoothing >= 0 ? options.smoothing : n > 300 ? 0.9 : n > 30 ? 0.7 : 0.0;
    const char* color = series_color(k);
    if (weight > 0 && weight < 1) {
      // Smooth the full series, then thin it: smoothing the thinned one would weigh min/max spikes.
      const std::vector<double> smooth = smooth_ema(std::vector<double>(s.y.begin(), s.y.begin() + static_cast<long>(n)), weight);
      const XY ds = downsample_min_max(s.x, smooth, options.max_points);
      out += polyline(f, d.x, d.y, color, "raw");
      out += polyline(f, ds.x, ds.y, color, "line");
    } else {
      out += polyline(f, d.x, d.y, color, "line");
      if (n <= 20) {
        for (size_t i = 0; i < d.x.size(); ++i) {
          out += "<circle cx=\"" + fmt(f.px(d.x[i])) + "\" cy=\"" + fmt(f.py(d.y[i])) + "\" r=\"2.5\" fill=\"" + color +
                 "\"/>";
        }
      }
    }
  }
  return out + "</svg>";
}

std::string stacked_bar_chart_svg(const StackedBarChart& chart) {
  Frame f;
  f.width = chart.width;
  f.height = chart.height;
  const size_t n = chart.x.size();
  double top = 0;
  for (size_t i = 0; i < n; ++i) {
    double sum = 0;
    for (const auto& layer : chart.layers) sum += i < layer.size() ? std::max(layer[i], 0.0) : 0.0;
    top = std::max(top, sum);
  }
  // Bars are centred on their x, so the x axis reaches half a bar beyond the first and last.
  const double spacing = n > 1 ? (chart.x.back() - chart.x.front()) / static_cast<double>(n - 1) : 1.0;
  const double xlo = n ? chart.x.front() - spacing / 2 : 0, xhi = n ? chart.x.back() + spacing / 2 : 1;
  f.xt = nice_ticks(xlo, xhi, 6);
  f.xt.lo = xlo;  // bars fill the plot; ticks outside the range are dropped below
  f.xt.hi = xhi;
  std::erase_if(f.xt.values, [&](double v) { return v < xlo || v > xhi; });
  f.yt = nice_ticks(0, top > 0 ? top : 1, 5);
  f.yt.lo = 0;
  std::erase_if(f.yt.values, [](double v) { return v < 0; });
  std::string out = f.begin(chart.title, chart.layer_names);
  out += f.axes(chart.x_label, chart.y_label);
  const double bar_width = std::max(1.0, (f.px(xlo + spacing) - f.px(xlo)) * 0.85);
  for (size_t i = 0; i < n; ++i) {
    double base = 0;
    for (size_t l = 0; l < chart.layers.size(); ++l) {
      const double h = i < chart.layers[l].size() ? std::max(chart.layers[l][i], 0.0) : 0.0;
      if (h <= 0) continue;
      const double y_top = f.py(base + h), y_bottom = f.py(base);
      out += "<rect x=\"" + fmt(f.px(chart.x[i]) - bar_width / 2) + "\" y=\"" + fmt(y_top) + "\" width=\"" +
             fmt(bar_width) + "\" height=\"" + fmt(std::max(y_bottom - y_top, 0.0)) + "\" fill=\"" + series_color(l) +
             "\"/>";
      base += h;
    }
  }
  return out + "</svg>";
}

std::string gantt_chart_svg(const GanttChart& chart) {
  std::vector<std::string> rows, labels;
  std::map<std::string, size_t> row_index, label_index;
  double lo = INFINITY, hi = -INFINITY;
  for (const auto& s : chart.spans) {
    if (row_index.emplace(s.row, rows.size()).second) rows.push_back(s.row);
    if (label_index.emplace(s.label, labels.size()).second) labels.push_back(s.label);
    lo = std::min(lo, s.start);
    hi = std::max(hi, s.end);
  }
  if (!std::isfinite(lo)) lo = hi = 0;
  constexpr int kRowHeight = 26;
  // Pool names are on the left: a wider margin than the numeric charts.
  size_t longest = 0;
  for (const auto& r : rows) longest = std::max(longest, r.size());
  const double left = std::max(64.0, 12 + 7.0 * static_cast<double>(longest));
  Frame f;
  f.width = chart.width;
  int legend_rows = 0;
  legend_svg(labels, kLeft, 0, chart.width - kLeft - kRight, legend_rows);
  const int top = kTitleHeight + 10 + std::max(legend_rows, 1) * kLegendRowHeight + 14;
  f.height = top + static_cast<int>(rows.size()) * kRowHeight + kBottom;
  f.xt = nice_ticks(0, hi - lo, 8);
  std::string out = f.begin(chart.title, labels.size() > 1 ? labels : std::vector<std::string>{});
  f.top = top;
  const double plot_w = chart.width - left - kRight;
  auto px = [&](double t) { return left + (t - lo) / (f.xt.hi - f.xt.lo) * plot_w; };
  const double bottom = f.height - kBottom;
  for (double v : f.xt.values) {
    const double x = left + (v - f.xt.lo) / (f.xt.hi - f.xt.lo) * plot_w;
    out += "<line x1=\"" + fmt(x) + "\" y1=\"" + std::to_string(top) + "\" x2=\"" + fmt(x) + "\" y2=\"" + fmt(bottom) +
           "\" class=\"grid\"/>";
    out += "<text x=\"" + fmt(x) + "\" y=\"" + fmt(bottom + 17) + "\" class=\"xtick\">" + format_tick(v, f.xt.step) +
           "</text>";
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    const double y = top + static_cast<double>(r) * kRowHeight;
    out += "<text x=\"" + fmt(left - 6) + "\" y=\"" + fmt(y + kRowHeight / 2.0 + 4) + "\" class=\"ytick\">" +
           html_escape(rows[r]) + "</text>";
  }
  for (const auto& s : chart.spans) {
    const double y = top + static_cast<double>(row_index[s.row]) * kRowHeight + 3;
    const double x0 = px(s.start), w = std::max(px(s.end) - x0, 1.0);
    out += "<rect x=\"" + fmt(x0) + "\" y=\"" + fmt(y) + "\" width=\"" + fmt(w) + "\" height=\"" +
           std::to_string(kRowHeight - 6) + "\" fill=\"" + series_color(label_index[s.label]) + "\"><title>" +
           html_escape(s.row + ": " + s.label + " " + format_number(s.end - s.start) + " s") + "</title></rect>";
    if (w > 7.0 * static_cast<double>(s.label.size()) + 6) {
      out += "<text x=\"" + fmt(x0 + 4) + "\" y=\"" + fmt(y + kRowHeight / 2.0 + 1) + "\" class=\"barlabel\">" +
             html_escape(s.label) + "</text>";
    }
  }
  for (const auto& m : chart.markers) {
    const double x = px(m.x);
    out += "<line x1=\"" + fmt(x) + "\" y1=\"" + fmt(top - 12.0) + "\" x2=\"" + fmt(x) + "\" y2=\"" + fmt(bottom) +
           "\" class=\"marker\"/>";
    out += "<text x=\"" + fmt(x + 3) + "\" y=\"" + fmt(top - 3.0) + "\" class=\"legend\">" + html_escape(m.label) +
           "</text>";
  }
  out += "<line x1=\"" + fmt(left) + "\" y1=\"" + fmt(bottom) + "\" x2=\"" + fmt(left + plot_w) + "\" y2=\"" +
         fmt(bottom) + "\" class=\"axis\"/>";
  out += "<text x=\"" + fmt(left + plot_w / 2) + "\" y=\"" + fmt(f.height - 6.0) + "\" class=\"xlabel\">" +
         html_escape(chart.x_label) + "</text>";
  return out + "</svg>";
}

}  // namespace hybridflow::report
