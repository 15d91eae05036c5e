// The measuring half of `hybridflow plan --calibrate` (the cost model it feeds lives in src/placement/).
// Runs through the trainer library: each run's config is the fragment `--write-config` would write for its
// plan, loaded by load_rl_config and checked by RLTrainer like any user's config.
#include "plan_calibrate.h"

#include <ATen/Parallel.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/remove_tree.h"
#include "hybridflow/engine/roofline.h"
#include "hybridflow/model/model_size.h"
#include "hybridflow/placement/collective_probe.h"
#include "hybridflow/placement/simulator.h"
#include "hybridflow/placement/trainer_support.h"
#include "hybridflow/tasks/task.h"
#include "hybridflow/trainer/rl_trainer.h"

namespace hybridflow::cli {

namespace {

using namespace placement;

// The calibration runs' model: the shape of the `tiny` preset, 2 or 4 layers, over the addition task's
// character vocabulary.
constexpr int64_t kHidden = 128, kHeads = 4, kKvHeads = 2, kIntermediate = 344;

struct RunSpec {
  std::string use;  // "fit" | "check" | "async"
  Plan plan;
  Workload workload;
  int64_t layers = 4;
};

struct Measured {
  std::map<int64_t, std::map<std::string, double>> per_step;  // measured step -> timeline call -> seconds
  double step_s = 0;                     // best wall seconds of RLTrainer::step()
  double mean_step_s = 0;                // their mean: a pipelined run's steps differ (one drains the buffer)
  double prompt_length = 0;              // mean prompt tokens the trainer reported
};

int64_t task_vocab() {
  TaskOptions o;
  o.min_digits = o.max_digits = 2;
  return 4 + static_cast<int64_t>(make_task("addition", o)->alphabet().size());
}

ModelShape calibration_shape(int64_t layers) {
  ModelShape m;
  m.name = "calibration";
  m.layers = layers;
  m.hidden = kHidden;
  m.intermediate = kIntermediate;
  m.heads = kHeads;
  m.kv_heads = kKvHeads;
  m.head_dim = kHidden / kHeads;
  m.vocab = task_vocab();
  return m;
}

Workload calibration_workload(int64_t prompts, int64_t response, int64_t micro) {
  Workload w;
  w.algorithm = Algorithm::kPPO;
  w.reward_model = false;  // the task's rule reward
  w.prompts = prompts;
  w.prompt_length = 7;     // "12+34=" and BOS; replaced by what the run reports
  w.response_length = response;
  w.train_micro_rows = micro;
  w.infer_micro_rows = 16;
  w.param_bytes = 4;
  w.distributed_optimizer = false;
  return w;
}

Plan colocated(int devices) {
  Plan p;
  p.sets.push_back({{Role::kActor, Role::kRollout, Role::kRef, Role::kCritic}, devices});
  for (Role r : {Role::kActor, Role::kRollout, Role::kRef, Role::kCritic}) p.layout(r) = {1, 1, devices};
  return p;
}

Plan split() {
  Plan p;
  p.sets.push_back({{Role::kActor, Role::kRollout, Role::kRef}, 1});
  p.sets.push_back({{Role::kCritic}, 1});
  for (Role r : {Role::kActor, Role::kRollout, Role::kRef, Role::kCritic}) p.layout(r) = {1, 1, 1};
  return p;
}

// The rollout on a process of its own, up to `staleness` steps off-policy (trainer.placement: standalone).
Plan standalone_rollout(int staleness) {
  Plan p;
  p.sets.push_back({{Role::kActor, Role::kRef, Role::kCritic}, 1});
  p.sets.push_back({{Role::kRollout}, 1});
  for (Role r : {Role::kActor, Role::kRollout, Role::kRef, Role::kCritic}) p.layout(r) = {1, 1, 1};
  p.staleness = staleness;
  return p;
}

bool standalone(const Plan& p) { return p.set_of(Role::kRollout) != p.set_of(Role::kActor); }

std::vector<RunSpec> runs(bool quick) {
  // The fit runs vary layers, batch, response length and micro-batches, so that each fixed cost has its
  // own lever; the checks are a bigger batch on two processes: colocated, split and a standalone rollout;
  // the async runs time a standalone rollout at staleness 0 and 2 for the speed-up.
  const int64_t big = quick ? 8 : 32;
  return {{"fit", colocated(1), calibration_workload(8, 8, 4), 2},
          {"fit", colocated(1), calibration_workload(quick ? 8 : 16, 16, 2), 4},
          {"fit", colocated(1), calibration_workload(quick ? 8 : 16, quick ? 16 : 32, quick ? 8 : 16), 4},
          {"fit", colocated(1), calibration_workload(quick ? 8 : 24, 8, quick ? 8 : 24), 2},
          {"check", colocated(2), calibration_workload(big, 16, 4), 4},
          {"check", split(), calibration_workload(big, 16, 4), 4},
          {"check", standalone_rollout(1), calibration_workload(big, 16, 4), 4},
          {"async", standalone_rollout(0), calibration_workload(big, 16, 4), 4},
          {"async", standalone_rollout(2), calibration_workload(big, 16, 4), 4}};
}

Measured run_trainer(const RunSpec& spec, const std::string& dir, int steps) {
  make_dirs(dir);
  // k steps ahead, the last k steps have no next rollouts to generate: they are not the steady state, so a
  // staleness-k run takes k more steps and measures none of them.
  const int total = steps + spec.plan.staleness;
  const std::string fragment = dir + "/plan.yaml";
  write_file_atomic(fragment, trainer_config_fragment(spec.plan, spec.workload, TrainerCapabilities::today()));
  const std::vector<std::string> overrides = {
      "data.task=addition", "data.min_digits=2", "data.max_digits=2", "data.train_size=512", "data.test_size=4",
      "model.hidden_size=" + std::to_string(kHidden), "model.num_hidden_layers=" + std::to_string(spec.layers),
      "model.num_attention_heads=" + std::to_string(kHeads), "model.num_key_value_heads=" + std::to_string(kKvHeads),
      "model.intermediate_size=" + std::to_string(kIntermediate), "algorithm.adv_estimator=gae",
      
      // The reference the plan costs runs only for a KL term.
      std::string("actor_rollout_ref.actor.use_kl_loss=") + (spec.workload.reference ? "true" : "false"), "trainer.total_steps=" + std::to_string(total),
      "trainer.run_dir=" + dir + "/run", "trainer.logger=[jsonl]", "trainer.log_samples_freq=1000"};
  const Config config = load_rl_config(fragment, overrides);
  // Best of the measured steps, per call and per step, as the rooflines take best-of times: on a shared
  // machine noise only ever adds time.
  Measured m;
  m.step_s = 1e30;
  int timed = 0;
  {
    RLTrainer trainer(config);
    for (int s = 0; s < total; ++s) {
      const auto start = std::chrono::steady_clock::now();
      const nlohmann::json record = trainer.step();
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (s == 0 || s >= steps) continue;  // warm-up (first allocations, lazy initialisation); the extra step
      m.step_s = std::min(m.step_s, seconds);
      m.mean_step_s += seconds;
      ++timed;
      if (record.contains("prompt_length/mean")) m.prompt_length = record.at("prompt_length/mean").get<double>();
    }
  }
  if (timed > 0) m.mean_step_s /= timed;
  std::ifstream timeline(dir + "/run/timeline.jsonl");
  for (std::string line; std::getline(timeline, line);) {
    if (line.empty()) continue;
    const nlohmann::json row = nlohmann::json::parse(line);
    const int64_t step = row.at("step").get<int64_t>();
    if (step < 2 || step > steps) continue;
    m.per_step[step][row.at("call").get<std::string>()] += row.at("end_s").get<double>() - row.at("start_s").get<double>();
  }
  HF_CHECK(!m.per_step.empty(), "calibration: the run wrote no timeline for its measured steps");
  return m;
}

// The calls a run's timeline can time apart: those a pool runs back to back in one stage are summed, since
// the controller records queued calls' ends as their results arrive, which splits a pool's busy time between
// its queued calls only approximately.
struct CallGroup {
  std::string label;               // "pool 0 preparation"
  std::vector<size_t> calls;       // indices into iteration_calls(workload)
};

std::vector<CallGroup> call_groups(const RunSpec& spec) {
  std::vector<CallGroup> groups;
  std::map<std::pair<int, Stage>, size_t> index;
  const std::vector<Call> calls = iteration_calls(spec.workload);
  for (size_t i = 0; i < calls.size(); ++i) {
    const auto key = std::make_pair(spec.plan.set_of(calls[i].role), calls[i].stage);
    if (!index.count(key)) {
      index[key] = groups.size();
      groups.push_back({"pool " + std::to_string(key.first) + " " + stage_name(key.second), {}});
    }
    groups[index[key]].calls.push_back(i);
  }
  return groups;
}

// The best over the measured steps of a group's summed seconds. A call is recorded in the step during which
// its result arrived: a standalone rollout one step ahead (staleness 1) may finish its generation inside the
// step before, so a step lacking a call of the group is skipped, not an error.
double measured_seconds(const Measured& m, const RunSpec& spec, const CallGroup& g) {
  const std::vector<Call> calls = iteration_calls(spec.workload);
  double best = 1e30;
  std::string missing;
  for (const auto& [step, seconds] : m.per_step) {
    double sum = 0;
    bool complete = true;
    for (size_t i : g.calls) {
      const std::string name = timeline_name(calls[i], standalone(spec.plan));
      const auto it = seconds.find(name);
      if (it == seconds.end()) {
        complete = false, missing = name;
        break;
      }
      sum += it->second;
    }
    if (complete) best = std::min(best, sum);
  }
  HF_CHECK(best < 1e30, "calibration: no measured step of the trainer's timeline has ", missing);
  return best;
}

// The simulator's cost of each call group of a run, split into what the fit scales (compute at efficiency 1),
// what it takes as costed (memory, communication) and the overheads' counts.
std::vector<FitRow> fit_rows(const RunSpec& spec, const Measured& m, const ClusterSpec& device) {
  const ModelShape model = calibration_shape(spec.layers);
  const Workload& w = spec.workload;
  ClusterSpec bare = cluster_of(device, device.gpus_per_node, device.gpus_per_node);
  bare.overheads = {};
  bare.train_efficiency = bare.forward_efficiency = 1.0;
  const Estimate e = simulate(spec.plan, bare, model, w);
  HF_CHECK(e.feasible, "calibration plan ", spec.plan.describe(), " is infeasible: ", e.why_not);
  const int rollout_set = spec.plan.set_of(Role::kRollout);
  const bool together = rollout_set == spec.plan.set_of(Role::kActor);
  const double kv = e.memory[static_cast<size_t>(rollout_set)].kv_capacity;
  const std::vector<Call> calls = iteration_calls(w);
  std::vector<FitRow> rows;
  for (const CallGroup& g : call_groups(spec)) {
    FitRow row;
    row.measured_s = measured_seconds(m, spec, g);
    for (size_t i : g.calls) {
      auto cost = [&](const Overheads& o) {
        ClusterSpec c = bare;
        c.overheads = o;
        const CostInputs in{c, model, w};
        return call_cost(in, calls[i], spec.plan.layout(calls[i].role), kv,
                         together ? &spec.plan.layout(Role::kActor) : nullptr);
      };
      const Breakdown base = cost({});
      row.compute_s += base.compute_s;
      row.fixed_s += base.memory_s + base.comm_s;
      row.counts[0] += cost({1, 0, 0, 0, 0}).overhead_s;
      row.counts[1] += cost({0, 1, 0, 0, 0}).overhead_s;
      row.counts[2] += cost({0, 0, 1, 0, 0}).overhead_s;
      row.counts[3] += cost({0, 0, 0, 1, 0}).overhead_s;
    }
    rows.push_back(row);
  }
  return rows;
}

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
}

double load_average() {
  std::ifstream in("/proc/loadavg");
  double load = 0;
  in >> load;
  return load;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return buf;
}

}  // namespace

Calibration calibrate_this_machine(const CalibrateOptions& options) {
  HF_CHECK(options.steps >= 2, "--calibrate-steps must be at least 2 (the first step is a warm-up), got ", options.steps);
  auto say = [&](const std::string& s) {
    if (options.verbose) std::printf("%s\n", s.c_str()), std::fflush(stdout);
  };
  Calibration cal;
  cal.created = utc_now();
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  cal.host = host;
  cal.cores = available_cores();
  cal.memory_bytes = available_memory().bytes;
  // Forked ranks first: this process has run no OpenMP work yet.
  const CollectiveProbe probe = measure_local_allreduce(2, options.quick ? (4 << 20) : (32 << 20), options.quick ? 2 : 5);
  cal.allreduce_bandwidth = probe.bus_bandwidth;
  cal.allreduce_latency_s = probe.latency_s;
  say("all-reduce, 2 local processes (Gloo): " + std::to_string(probe.bus_bandwidth / 1e9) + " GB/s bus bandwidth, " +
      std::to_string(probe.latency_s * 1e6) + " us per ring step");
  at::set_num_threads(1);  // one worker process runs one thread (trainer.threads_per_worker)
  ModelConfig shape;
  shape.vocab_size = task_vocab();
  shape.hidden_size = kHidden;
  shape.intermediate_size = kIntermediate;
  shape.num_hidden_layers = 4;
  shape.num_attention_heads = kHeads;
  shape.num_key_value_heads = kKvHeads;
  cal.matmul_flops = time_matmuls(model_matmul_shapes(shape), 256, torch::kFloat32, options.quick ? 0.05 : 0.3).gflops() * 1e9;
  cal.memory_bandwidth = stream_triad_gb_per_s(options.quick ? (1 << 22) : (1 << 24), options.quick ? 2 : 5) * 1e9;
  say("one thread: " + std::to_string(cal.matmul_flops / 1e9) + " GFLOP/s fp32 matmul at the calibration model's shapes, " +
      std::to_string(cal.memory_bandwidth / 1e9) + " GB/s STREAM triad; " + std::to_string(cal.cores) + " cores");

  const char* tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/hybridflow-calibrate-XXXXXX";
  HF_CHECK(::mkdtemp(dir.data()) != nullptr, "calibration: cannot make a temporary directory from ", dir);
  std::vector<RunSpec> specs = runs(options.quick);
  std::vector<Measured> measured;
  for (size_t i = 0; i < specs.size(); ++i) {
    Measured m = run_trainer(specs[i], dir + "/run" + std::to_string(i), options.steps);
    if (m.prompt_length > 0) specs[i].workload.prompt_length = static_cast<int64_t>(std::lround(m.prompt_length));
    say("  " + specs[i].use + " run " + specs[i].plan.placement_name() + " " + specs[i].plan.describe() + ", " +
        std::to_string(specs[i].layers) + " layers, " + std::to_string(specs[i].workload.prompts) + " prompts, " +
        std::to_string(specs[i].workload.response_length) + " tokens: " + std::to_string(m.step_s) + " s/step");
    measured.push_back(std::move(m));
  }
  // Fit the overheads and the compute efficiency to the calls of the one-process runs.
  std::vector<FitRow> rows;
  for (size_t i = 0; i < specs.size(); ++i)
    if (specs[i].use == "fit") {
      const auto r = fit_rows(specs[i], measured[i], cal.device());
      rows.insert(rows.end(), r.begin(), r.end());
    }
  const FitResult fit = fit_overheads(rows);
  cal.compute_efficiency = 1.0 / fit.compute_scale;
  cal.overheads.call_s = fit.call_s;
  cal.overheads.micro_batch_s = fit.micro_batch_s;
  cal.overheads.layer_pass_s = fit.layer_pass_s;
  cal.overheads.decode_step_s = fit.decode_step_s;
  // The controller's own work per step: what the fit runs' steps took beyond their simulated calls.
  auto simulated = [&](const RunSpec& s) {
    const ClusterSpec c = cluster_of(cal.device(), cal.cores, cal.cores);
    const Estimate e = simulate(s.plan, c, calibration_shape(s.layers), s.workload);
    HF_CHECK(e.feasible, "calibration plan ", s.plan.describe(), " is infeasible: ", e.why_not);
    return e;
  };
  // The controller's own work per step: what a one-process step took beyond its calls (they run one after
  // another there).
  double beyond = 0;
  int fits = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].use != "fit") continue;
    double calls = 0;
    for (const CallGroup& g : call_groups(specs[i])) calls += measured_seconds(measured[i], specs[i], g);
    beyond += measured[i].step_s - calls;
    ++fits;
  }
  cal.overheads.iteration_s = std::max(0.0, beyond / fits);
  for (size_t i = 0; i < specs.size(); ++i) {
    const Estimate e = simulated(specs[i]);
    CalibrationCheck check{specs[i].plan.placement_name(), specs[i].plan.describe(), specs[i].use,
                           specs[i].plan.staleness,
                           specs[i].use == "async" ? measured[i].mean_step_s : measured[i].step_s, e.iteration_s, {}};
    // k steps ahead, a generation's result may arrive in any of k steps: only the step time is compared.
    if (specs[i].use == "async") {
      cal.checks.push_back(check);
      continue;
    }
    for (const CallGroup& g : call_groups(specs[i])) {
      double predicted = 0;
      std::string names;
      for (size_t k : g.calls) {
        const CallEstimate& c = *std::find_if(e.calls.begin(), e.calls.end(), [&](const CallEstimate& x) {
          return x.name == timeline_name(iteration_calls(specs[i].workload)[k], standalone(specs[i].plan));
        });
        predicted += c.cost.total();
        names += (names.empty() ? "" : "+") + c.name.substr(c.name.find('.') + 1);
      }
      check.calls[g.label + " (" + names + ")"] = {measured_seconds(measured[i], specs[i], g), predicted};
    }
    cal.checks.push_back(check);
  }
  cal.load_average = load_average();
  remove_tree(dir);  // the calibration's scratch runs; a leftover is harmless
  say("fitted: compute efficiency " + std::to_string(cal.compute_efficiency) + ", per call " +
      std::to_string(cal.overheads.call_s * 1e3) + " ms, per micro-batch pass " +
      std::to_string(cal.overheads.micro_batch_s * 1e3) + " ms, per layer pass " + std::to_string(cal.overheads.layer_pass_s * 1e6) +
      " us, per decode step " + std::to_string(cal.overheads.decode_step_s * 1e6) + " us, controller per step " +
      std::to_string(cal.overheads.iteration_s * 1e3) + " ms (calls fitted within " +
      std::to_string(fit.rms_relative_error * 100) + "% rms)");
  return cal;
}

}  // namespace hybridflow::cli
