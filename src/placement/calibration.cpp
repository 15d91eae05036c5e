#include "hybridflow/placement/calibration.h"

#include <array>
#include <cmath>
#include <cstdlib>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"

namespace hybridflow::placement {

namespace {

template <typename T>
T field(const nlohmann::json& j, const char* key, const std::string& where) {
  HF_CHECK(j.is_object() && j.contains(key), where, ": missing field '", key, "' (rerun hybridflow plan --calibrate)");
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    HF_FAIL(where, ": field '", key, "' has the wrong type: ", j.at(key).dump());
  }
}

}  // namespace

nlohmann::json Calibration::to_json() const {
  nlohmann::json checks_json = nlohmann::json::array();
  for (const auto& c : checks) {
    nlohmann::json calls = nlohmann::json::object();
    for (const auto& [name, mp] : c.calls) calls[name] = {{"measured_s", mp.first}, {"predicted_s", mp.second}};
    checks_json.push_back({{"placement", c.placement}, {"layout", c.layout}, {"use", c.use},
                           {"staleness", c.staleness},
                           {"measured_s", c.measured_s}, {"predicted_s", c.predicted_s}, {"error", c.error()},
                           {"calls", calls}});
  }
  return {{"format", "hybridflow-calibration-1"},
          {"created", created},
          {"host", host},
          {"load_average", load_average},
          {"cores", cores},
          {"memory_bytes", memory_bytes},
          {"matmul_flops", matmul_flops},
          {"memory_bandwidth", memory_bandwidth},
          {"allreduce_bandwidth", allreduce_bandwidth},
          {"allreduce_latency_s", allreduce_latency_s},
          {"compute_efficiency", compute_efficiency},
          {"overheads",
           {{"call_s", overheads.call_s},
            {"micro_batch_s", overheads.micro_batch_s},
            {"layer_pass_s", overheads.layer_pass_s},
            {"decode_step_s", overheads.decode_step_s},
            {"iteration_s", overheads.iteration_s}}},
          {"checks", checks_json}};
}

Calibration Calibration::from_json(const nlohmann::json& j, const std::string& where) {
  Calibration c;
  c.created = field<std::string>(j, "created", where);
  c.host = field<std::string>(j, "host", where);
  c.load_average = field<double>(j, "load_average", where);
  c.cores = field<int>(j, "cores", where);
  c.memory_bytes = field<double>(j, "memory_bytes", where);
  c.matmul_flops = field<double>(j, "matmul_flops", where);
  c.memory_bandwidth = field<double>(j, "memory_bandwidth", where);
  c.allreduce_bandwidth = field<double>(j, "allreduce_bandwidth", where);
  c.allreduce_latency_s = field<double>(j, "allreduce_latency_s", where);
  c.compute_efficiency = field<double>(j, "compute_efficiency", where);
  const auto o = field<nlohmann::json>(j, "overheads", where);
  const std::string ow = where + ": overheads";
  c.overheads.call_s = field<double>(o, "call_s", ow);
  c.overheads.micro_batch_s = field<double>(o, "micro_batch_s", ow);
  c.overheads.layer_pass_s = field<double>(o, "layer_pass_s", ow);
  c.overheads.decode_step_s = field<double>(o, "decode_step_s", ow);
  c.overheads.iteration_s = field<double>(o, "iteration_s", ow);
  for (const auto& k : field<nlohmann::json>(j, "checks", where)) {
    CalibrationCheck check;
    const std::string cw = where + ": checks";
    check.placement = field<std::string>(k, "placement", cw);
    check.layout = field<std::string>(k, "layout", cw);
    check.use = field<std::string>(k, "use", cw);
    check.staleness = k.contains("staleness") ? field<int>(k, "staleness", cw) : 0;  // older files: none
    check.measured_s = field<double>(k, "measured_s", cw);
    check.predicted_s = field<double>(k, "predicted_s", cw);
    if (k.contains("calls"))
      for (const auto& [name, mp] : k.at("calls").items())
        check.calls[name] = {field<double>(mp, "measured_s", cw), field<double>(mp, "predicted_s", cw)};
    c.checks.push_back(check);
  }
  HF_CHECK(c.cores >= 1 && c.matmul_flops > 0 && c.memory_bandwidth > 0 && c.allreduce_bandwidth > 0 &&
               c.compute_efficiency > 0 && c.memory_bytes > 0,
           where, ": the measured figures must be positive (rerun hybridflow plan --calibrate)");
  return c;
}

ClusterSpec Calibration::device() const {
  ClusterSpec d;
  d.name = "this-machine";
  d.nodes = 1;
  d.gpus_per_node = cores;
  d.memory_bytes = memory_bytes / cores;
  d.memory_reserve = 0.2;
  d.peak_flops = matmul_flops;
  d.memory_bandwidth = memory_bandwidth;
  d.intra_node_bandwidth = d.inter_node_bandwidth = allreduce_bandwidth;
  d.intra_node_latency_s = d.inter_node_latency_s = allreduce_latency_s;
  d.train_efficiency = d.forward_efficiency = compute_efficiency;
  d.decode_efficiency = 1.0;  // the triad is what one thread streams
  d.comm_efficiency = 1.0;    // the all-reduce was measured as it runs
  d.compute_units = cores;
  d.overheads = overheads;
  return d;
}

std::vector<SpeedupCheck> async_speedups(const Calibration& c) {
  std::vector<SpeedupCheck> out;
  for (const auto& base : c.checks) {
    if (base.use != "async" || base.staleness != 0 || base.measured_s <= 0 || base.predicted_s <= 0) continue;
    for (const auto& k : c.checks)
      if (k.use == "async" && k.staleness > 0 && k.layout == base.layout && k.measured_s > 0 && k.predicted_s > 0)
        out.push_back({k.layout, k.staleness, base.measured_s / k.measured_s, base.predicted_s / k.predicted_s});
  }
  return out;
}

std::string default_calibration_path() {
  if (const char* p = std::getenv("HF_CALIBRATION"); p != nullptr && *p != '\0') return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0')
    return std::string(x) + "/hybridflow/calibration.json";
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr && *home != '\0' ? home : ".") + "/.cache/hybridflow/calibration.json";
}

Calibration load_calibration(const std::string& path) {
  HF_CHECK(file_exists(path), "no calibration of this machine at ", path, ": run `hybridflow plan --calibrate` first ",
           "(or name a file with --calibration)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::parse_error& e) {
    HF_FAIL(path, ": not JSON: ", e.what());
  }
  return Calibration::from_json(j, path);
}

void save_calibration(const std::string& path, const Calibration& c) {
  const auto slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) make_dirs(path.substr(0, slash));
  write_file_atomic(path, c.to_json().dump(2) + "\n");
}

FitResult fit_overheads(const std::vector<FitRow>& rows) {
  HF_CHECK(!rows.empty(), "fit_overheads: no measured calls");
  // Columns of the weighted problem: compute, then the three counts; x >= 0 by projected coordinate descent
  // (a convex quadratic in five variables, so this converges to the constrained optimum).
  const size_t n = rows.size();
  std::vector<std::array<double, 5>> col(n);
  std::vector<double> target(n);
  for (size_t i = 0; i < n; ++i) {
    HF_CHECK(rows[i].measured_s > 0, "fit_overheads: a measured call took ", rows[i].measured_s, " s");
    const double w = 1.0 / rows[i].measured_s;
    col[i] = {rows[i].compute_s * w, rows[i].counts[0] * w, rows[i].counts[1] * w, rows[i].counts[2] * w,
              rows[i].counts[3] * w};
    target[i] = (rows[i].measured_s - rows[i].fixed_s) * w;
  }
  std::array<double, 5> x = {1.0, 0.0, 0.0, 0.0, 0.0};
  std::vector<double> residual(n);
  for (int iter = 0; iter < 5000; ++iter) {
    for (size_t k = 0; k < 5; ++k) {
      double num = 0, den = 0;
      for (size_t i = 0; i < n; ++i) {
        double r = -target[i];
        for (size_t m = 0; m < 5; ++m) r += col[i][m] * x[m];
        num += r * col[i][k];
        den += col[i][k] * col[i][k];
      }
      // A whole pass cannot beat the matmul peak: the compute scale stays at 1 or above.
      if (den > 0) x[k] = std::max(k == 0 ? 1.0 : 0.0, x[k] - num / den);
    }
  }
  FitResult f;
  f.compute_scale = x[0];
  f.call_s = x[1];
  f.micro_batch_s = x[2];
  f.layer_pass_s = x[3];
  f.decode_step_s = x[4];
  double sq = 0;
  for (size_t i = 0; i < n; ++i) {
    double r = -target[i];
    for (size_t m = 0; m < 5; ++m) r += col[i][m] * x[m];
    sq += r * r;
  }
  f.rms_relative_error = std::sqrt(sq / n);
  return f;
}

}  // namespace hybridflow::placement
