#include "hybridflow/report/tensorboard_export.h"

#include <map>
#include <vector>

#include "hybridflow/report/chart_scale.h"
#include "hybridflow/report/run_data.h"
#include "hybridflow/report/tensorboard_writer.h"

namespace hybridflow::report {
namespace {

std::string indented(const std::string& text) {
  std::string out = "    ";
  for (char c : text) {
    out += c;
    if (c == '\n') out += "    ";
  }
  return out;
}

}  // namespace

std::string samples_markdown(const std::vector<const Sample*>& samples) {
  std::string md;
  for (const Sample* s : samples) {
    if (!md.empty()) md += "\n\n---\n\n";
    md += "**reward** " + (s->reward ? format_number(*s->reward) : std::string("-")) + ", **advantage** " +
          (s->advantage ? format_number(*s->advantage) : std::string("-")) + "\n\nprompt:\n\n" + indented(s->prompt) +
          "\n\nresponse:\n\n" + indented(s->response);
  }
  return md;
}

TensorBoardExport export_run_to_tensorboard(const std::string& run_dir, const std::string& logdir) {
  const RunData run = load_run(run_dir);
  std::map<int64_t, std::map<std::string, double>> by_step;
  for (const auto& [name, series] : run.metrics)
    for (size_t i = 0; i < series.steps.size(); ++i) by_step[static_cast<int64_t>(series.steps[i])][name] = series.values[i];
  std::map<int64_t, std::vector<const Sample*>> samples;
  for (const auto& s : run.samples) samples[s.step].push_back(&s);

  TensorBoardWriter writer(logdir);
  TensorBoardExport result;
  result.event_file = writer.path();
  result.steps = run.steps.size();
  for (const auto& [step, values] : by_step) {
    writer.add_scalars(values, step);
    result.scalars += values.size();
  }
  for (const auto& [step, rows] : samples) {
    writer.add_text("samples", samples_markdown(rows), step);
    ++result.text_steps;
  }
  return result;
}

}  // namespace hybridflow::report
