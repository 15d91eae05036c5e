// `hybridflow bench` output: one Measurement per line, as an aligned table for people or, with --json, one
// JSON object per line for scripts (what, batch, tokens_per_s, roofline_ratio, achieved, bound, units, ...).
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace hybridflow::cli {

struct Measurement {
  std::string what;          // "stream triad", "matmul pass", "decode", "prefill", "rollout", "train"
  int64_t batch = 0;         // rows per step (0 where none applies)
  double tokens_per_s = 0;   // for machine lines: the tokens/s that bound alone would allow
  double achieved = 0;       // in `units`
  double bound = 0;          // the measured limit, in `units`
  std::string bound_kind;    // "bandwidth" (stream triad) or "matmul" (the model's matmuls at these rows)
  std::string units;         // "GB/s" or "GFLOP/s"
  nlohmann::json extra = nlohmann::json::object();  // wall seconds, lengths, ...
  double roofline_ratio() const { return bound > 0 ? achieved / bound : 0.0; }
};

inline void print_measurement(const Measurement& m, bool json) {
  if (json) {
    nlohmann::json line = {{"what", m.what},         {"batch", m.batch},
                           {"tokens_per_s", m.tokens_per_s}, {"roofline_ratio", m.roofline_ratio()},
                           {"achieved", m.achieved}, {"bound", m.bound},
                           {"bound_kind", m.bound_kind}, {"units", m.units}};
    for (const auto& [key, value] : m.extra.items()) line[key] = value;
    std::printf("%s\n", line.dump().c_str());
  } else {
    std::string note;
    for (const auto& [key, value] : m.extra.items()) {
      note += (note.empty() ? "" : ", ") + key + " " +
              (value.is_number_float() ? std::to_string(value.get<double>()).substr(0, 6) : value.dump());
    }
    std::printf("%-22s %6lld %12.1f %10.2f %-8s %10.2f %-8s %-10s %6.2f  %s\n", m.what.c_str(),
                static_cast<long long>(m.batch), m.tokens_per_s, m.achieved, m.units.c_str(), m.bound,
                m.units.c_str(), m.bound_kind.c_str(), m.roofline_ratio(), note.c_str());
  }
  std::fflush(stdout);  // a long run shows each figure as it is measured
}

inline void print_header(bool json) {
  if (json) return;
  std::printf("%-22s %6s %12s %19s %19s %-10s %6s\n", "what", "batch", "tokens/s", "achieved", "bound", "kind",
              "ratio");
}

}  // namespace hybridflow::cli
