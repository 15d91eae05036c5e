// `hybridflow plan`: the fastest device mapping of an RL algorithm on a cluster (HybridFlow's auto device
// mapping, src/placement/), with its simulated iteration, the runners-up, and a config fragment for
// `hybridflow train`; `--calibrate` measures this machine for `--gpu this-machine` (docs/placement.md).
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/model/model_presets.h"
#include "hybridflow/model/model_size.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/placement/auto_mapping.h"
#include "hybridflow/placement/calibration.h"
#include "plan_calibrate.h"

namespace hybridflow::cli {

namespace {

using namespace placement;

struct PlanOptions {
  int gpus = 0;
  int gpus_per_node = 0;  // 0: 8, or all of this machine's cores
  std::string gpu = "a100-80g";
  std::string model = "llama-7b";
  std::string algorithm = "ppo";
  int64_t prompt_length = 1024, response_length = 1024, batch = 1024;
  int64_t samples = 0;  // 0: 8 for grpo, else 1
  int64_t ppo_epochs = 1, mini_batches = 1, micro_batch = 1, forward_micro_batch = 4;
  std::string dtype;    // "": bf16 on GPUs, fp32 on this machine (the trainer's default)
  std::string reward_model = "auto";
  std::string reference = "on";
  bool no_distributed_optimizer = false;
  int staleness = 0;
  int sync_every = 1;
  int64_t max_num_seqs = 0;
  int runners_up = 5;
  bool json = false;
  std::string write_config;
  bool calibrate = false;
  std::string calibration;
  int calibrate_steps = 6;
  bool calibrate_quick = false;
};

ModelShape model_from(const std::string& name_or_dir) {
  if (file_exists(name_or_dir + "/config.json"))
    return model_shape_of(load_model_config(name_or_dir + "/config.json"), name_or_dir);
  return model_preset(name_or_dir);
}

Workload workload_from(const PlanOptions& o, bool this_machine) {
  Workload w;
  w.algorithm = parse_algorithm(o.algorithm);
  HF_CHECK(o.reward_model == "auto" || o.reward_model == "on" || o.reward_model == "off",
           "--reward-model must be auto, on or off, got '", o.reward_model, "'");
  w.reward_model = o.reward_model == "auto" ? w.algorithm != Algorithm::kGRPO : o.reward_model == "on";
  HF_CHECK(o.reference == "on" || o.reference == "off", "--reference must be on or off, got '", o.reference, "'");
  w.reference = o.reference == "on";
  w.prompts = o.batch;
  w.samples_per_prompt = o.samples > 0 ? o.samples : (w.algorithm == Algorithm::kGRPO ? 8 : 1);
  w.prompt_length = o.prompt_length;
  w.response_length = o.response_length;
  w.ppo_epochs = o.ppo_epochs;
  w.mini_batches = o.mini_batches;
  w.train_micro_rows = o.micro_batch;
  w.infer_micro_rows = o.forward_micro_batch;
  const std::string dtype = o.dtype.empty() ? (this_machine ? "fp32" : "bf16") : o.dtype;
  HF_CHECK(dtype == "bf16" || dtype == "fp32", "--dtype must be bf16 or fp32, got '", dtype, "'");
  w.param_bytes = dtype == "bf16" ? 2 : 4;
  w.distributed_optimizer = !o.no_distributed_optimizer;
  w.staleness = o.staleness;
  w.sync_every = o.sync_every;
  w.max_num_seqs = o.max_num_seqs;
  w.validate();
  return w;
}

// A parameter count as people write it (6.74B, 0.82M).
std::string count(double n) {
  char buf[32];
  if (n >= 1e9) std::snprintf(buf, sizeof buf, "%.2fB", n / 1e9);
  else std::snprintf(buf, sizeof buf, "%.2fM", n / 1e6);
  return buf;
}

std::string percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.1f%%", fraction * 100);
  return buf;
}

nlohmann::json plan_json(const RankedPlan& r, const ClusterSpec& cluster, const ModelShape& model) {
  const Plan& p = r.plan;
  const Estimate& e = r.estimate;
  nlohmann::json sets = nlohmann::json::array();
  for (size_t i = 0; i < p.sets.size(); ++i) {
    nlohmann::json roles = nlohmann::json::array();
    for (Role role : p.sets[i].roles)
      roles.push_back({{"role", role_name(role)}, {"pp", p.layout(role).pp}, {"tp", p.layout(role).tp},
                       {"dp", p.layout(role).dp}});
    nlohmann::json set = {{"devices", p.sets[i].devices}, {"roles", roles}};
    if (i < e.memory.size())
      set["memory"] = {{"persistent_bytes", e.memory[i].persistent}, {"peak_bytes", e.memory[i].peak},
                       {"usable_bytes", e.memory[i].usable}, {"kv_capacity_bytes", e.memory[i].kv_capacity}};
    sets.push_back(set);
  }
  nlohmann::json calls = nlohmann::json::array();
  for (const CallEstimate& c : e.calls)
    calls.push_back({{"call", c.name}, {"stage", stage_name(c.stage)}, {"pool", c.set}, {"start_s", c.start_s},
                     {"end_s", c.end_s}, {"compute_s", c.cost.compute_s}, {"memory_s", c.cost.memory_s},
                     {"comm_s", c.cost.comm_s}, {"overhead_s", c.cost.overhead_s}});
  const std::string why = trainer_cannot_run(p, TrainerCapabilities::today(), &model);
  return {{"placement", p.placement_name()},
          {"describe", p.describe()},
          {"staleness", p.staleness},
          {"sets", sets},
          {"feasible", e.feasible},
          {"iteration_s", e.iteration_s},
          {"tokens_per_s", e.tokens_per_s},
          {"tokens_per_s_per_device", e.tokens_per_s / cluster.devices()},
          {"stages_s",
           {{"generation", e.generation_s}, {"preparation", e.preparation_s}, {"training", e.training_s},
            {"reshard", e.reshard_s}, {"weight_sync", e.sync_s}, {"controller", e.controller_s}}},
          {"generation", {{"waves", e.generation_waves}, {"batch_per_replica", e.generation_batch}}},
          {"calls", calls},
          {"trainer", {{"runnable_today", why.empty()}, {"why_not", why}}}};
}

void print_plan(const RankedPlan& r, const ClusterSpec& cluster) {
  const Plan& p = r.plan;
  const Estimate& e = r.estimate;
  std::printf("placement: %s", p.placement_name().c_str());
  if (p.staleness > 0)
    std::printf(" (rollout up to %d step%s off-policy, weights synced every %d update%s)", p.staleness,
                p.staleness == 1 ? "" : "s", p.sync_every, p.sync_every == 1 ? "" : "s");
  std::printf("\n");
  for (size_t i = 0; i < p.sets.size(); ++i) {
    std::printf("  pool %zu, %d device%s:", i, p.sets[i].devices, p.sets[i].devices == 1 ? "" : "s");
    for (size_t j = 0; j < p.sets[i].roles.size(); ++j) {
      const Role role = p.sets[i].roles[j];
      std::printf("%s %s %s", j ? " |" : "", role_name(role).c_str(), layout_text(role, p.layout(role)).c_str());
    }
    std::printf("\n");
    if (i < e.memory.size()) {
      const SetMemory& m = e.memory[i];
      std::printf("    memory per device: %s persistent, %s at peak of %s usable", human_bytes(m.persistent).c_str(),
                  human_bytes(m.peak).c_str(), human_bytes(m.usable).c_str());
      if (m.kv_capacity > 0)
        std::printf("; KV cache %s (%" PRId64 " sequences per replica at once, %" PRId64 " wave%s)",
                    human_bytes(m.kv_capacity).c_str(), e.generation_batch, e.generation_waves, e.generation_waves == 1 ? "" : "s");
      std::printf("\n");
    }
  }
  std::printf("iteration %.2f s: %.0f tokens/s, %.1f per device\n", e.iteration_s, e.tokens_per_s,
              e.tokens_per_s / cluster.devices());
  std::printf("  busy seconds by stage (summed over pools; pools overlap): generation %.2f, preparation %.2f, "
              "training %.2f, resharding %.2f, weight sync %.2f, controller %.2f\n",
              e.generation_s, e.preparation_s, e.training_s, e.reshard_s, e.sync_s, e.controller_s);
  std::printf("  %-34s %4s %9s %9s %9s %9s %9s %9s\n", "call", "pool", "start s", "end s", "compute", "memory", "comm",
              "overhead");
  for (const CallEstimate& c : e.calls)
    std::printf("  %-34s %4s %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f\n", c.name.c_str(),
                c.set < 0 ? "-" : std::to_string(c.set).c_str(), c.start_s, c.end_s, c.cost.compute_s, c.cost.memory_s,
                c.cost.comm_s, c.cost.overhead_s);
}

// The first plan of the search's ranking whose rollout has devices of its own (it can run ahead), or null.
const RankedPlan* async_candidate(const SearchResult& result) {
  auto standalone = [](const Plan& p) { return p.set_of(Role::kRollout) != p.set_of(Role::kActor); };
  if (!result.found) return nullptr;
  if (standalone(result.best.plan)) return &result.best;
  for (const auto& r : result.runners_up)
    if (r.estimate.feasible && standalone(r.plan)) return &r;
  return nullptr;
}

// Staleness 0, 1, 2, 4 and the asked-for k.
std::vector<int> staleness_table_ks(int asked) {
  std::vector<int> ks = {0, 1, 2, 4};
  if (std::find(ks.begin(), ks.end(), asked) == ks.end()) ks.push_back(asked);
  std::sort(ks.begin(), ks.end());
  return ks;
}

void print_async(const RankedPlan& r, const std::vector<StalenessPoint>& points, int asked) {
  std::printf("\nasync speed-up (simulated), %s %s: seconds per step by staleness k, against k = 0\n",
              r.plan.placement_name().c_str(), r.plan.describe().c_str());
  std::printf("  %3s %11s %10s %9s\n", "k", "sync every", "step s", "speed-up");
  for (const StalenessPoint& p : points)
    std::printf("  %3d %11d %10.3f %8.2fx%s\n", p.staleness, p.sync_every, p.iteration_s, p.speedup,
                p.staleness == asked ? "  <- --staleness" : "");
}

void print_async_checks(const Calibration& cal) {
  for (const SpeedupCheck& s : async_speedups(cal))
    std::printf("  async speed-up, staleness %d over 0 (%s): measured %.2fx, predicted %.2fx (%s)\n", s.staleness,
                s.layout.c_str(), s.measured, s.predicted, percent(s.error()).c_str());
}

std::string runnable_text(const Plan& p, const ModelShape& model) {
  const std::string why = trainer_cannot_run(p, TrainerCapabilities::today(), &model);
  return why.empty() ? "runnable by hybridflow train" : "not runnable yet: " + why;
}

int run_plan(const PlanOptions& o) {
  const std::string calibration_path = o.calibration.empty() ? default_calibration_path() : o.calibration;
  if (o.calibrate) {
    CalibrateOptions c;
    c.steps = o.calibrate_steps;
    c.quick = o.calibrate_quick;
    c.verbose = !o.json;
    const Calibration cal = calibrate_this_machine(c);
    save_calibration(calibration_path, cal);
    if (o.json) {
      std::printf("%s\n", cal.to_json().dump().c_str());
      return 0;
    }
    std::printf("calibration written to %s\n", calibration_path.c_str());
    for (const auto& k : cal.checks) {
      const std::string placement = k.use == "async" ? k.placement + " k=" + std::to_string(k.staleness) : k.placement;
      std::printf("  %-5s %-10s %-44s measured %.3f s/step, predicted %.3f s (%s)\n", k.use.c_str(), placement.c_str(),
                  k.layout.c_str(), k.measured_s, k.predicted_s, percent(k.error()).c_str());
      for (const auto& [name, mp] : k.calls)
        std::printf("        %-36s measured %.4f s, predicted %.4f s\n", name.c_str(), mp.first, mp.second);
    }
    print_async_checks(cal);
    return 0;
  }
  HF_CHECK(o.gpus >= 1, "--gpus is required (the devices to plan for)");
  const bool this_machine = o.gpu == "this-machine";
  std::unique_ptr<Calibration> cal;
  ClusterSpec cluster;
  if (this_machine) {
    cal = std::make_unique<Calibration>(load_calibration(calibration_path));
    cluster = cluster_of(cal->device(), o.gpus, o.gpus_per_node > 0 ? o.gpus_per_node : std::max(o.gpus, cal->cores));
  } else {
    cluster = gpu_cluster(o.gpu, o.gpus, o.gpus_per_node > 0 ? o.gpus_per_node : 8);
  }
  const ModelShape model = model_from(o.model);
  const Workload workload = workload_from(o, this_machine);
  SearchOptions options;
  options.runners_up = o.runners_up;
  const SearchResult result = search_plans(cluster, model, workload, options);
  // The best plan today's trainer runs, when the overall best needs placements it does not have yet.
  std::unique_ptr<SearchResult> runnable;
  if (result.found && !trainer_cannot_run(result.best.plan, TrainerCapabilities::today(), &model).empty()) {
    SearchOptions today = options;
    today.capabilities = TrainerCapabilities::today();
    // A mixture of experts has a limit of its own (trainer_cannot_run with the model): the best placement
    // within it, from every placement's best.
    const bool experts = model.moe.num_experts > 0;
    today.runners_up = experts ? 1000 : 0;
    runnable = std::make_unique<SearchResult>(search_plans(cluster, model, workload, today));
    if (experts && runnable->found) {
      std::vector<RankedPlan> candidates = {runnable->best};
      candidates.insert(candidates.end(), runnable->runners_up.begin(), runnable->runners_up.end());
      runnable->found = false;
      for (const RankedPlan& c : candidates)  // fastest first
        if (trainer_cannot_run(c.plan, today.capabilities, &model).empty()) {
          runnable->best = c;
          runnable->found = true;
          break;
        }
      runnable->runners_up.clear();
    }
  }
  const RankedPlan* to_write = nullptr;
  if (result.found) to_write = runnable ? (runnable->found ? &runnable->best : nullptr) : &result.best;

  auto print_calibration = [&]() {
    if (!cal) return;
    std::printf("\nthis machine, calibrated %s (load average %.2f): last measured prediction error\n",
                cal->created.c_str(), cal->load_average);
    for (const auto& k : cal->checks)
      if (k.use == "check")
        std::printf("  %-10s %-44s measured %.3f s/step, predicted %.3f s (%s)\n", k.placement.c_str(),
                    k.layout.c_str(), k.measured_s, k.predicted_s, percent(k.error()).c_str());
    print_async_checks(*cal);
  };
  const RankedPlan* async_plan = async_candidate(result);
  std::vector<StalenessPoint> async_points;
  if (async_plan != nullptr)
    async_points = staleness_sweep(async_plan->plan, cluster, model, workload, staleness_table_ks(o.staleness));
  if (o.json) {
    nlohmann::json j = {
        {"cluster", {{"gpu", cluster.name}, {"devices", cluster.devices()}, {"gpus_per_node", cluster.gpus_per_node},
                     {"nodes", cluster.nodes}, {"memory_bytes", cluster.memory_bytes}, {"peak_flops", cluster.peak_flops},
                     {"memory_bandwidth", cluster.memory_bandwidth}}},
        {"model", {{"name", model.name}, {"parameters", model.parameters(false)},
                   {"active_parameters", model.active_parameters(false)}}},
        {"workload", {{"algorithm", algorithm_name(workload.algorithm)}, {"prompts", workload.prompts},
                      {"samples_per_prompt", workload.samples_per_prompt}, {"prompt_length", workload.prompt_length},
                      {"response_length", workload.response_length}, {"reward_model", workload.reward_model},
                      {"reference", workload.reference}, {"max_num_seqs", workload.max_num_seqs}}},
        {"search", {{"placements", result.placements}, {"allocations", result.allocations},
                    {"set_layouts", result.set_layouts}, {"layouts_costed", result.layouts_costed},
                    {"seconds", result.seconds}}},
        {"found", result.found}};
    if (result.found) j["best"] = plan_json(result.best, cluster, model);
    j["runners_up"] = nlohmann::json::array();
    for (const auto& r : result.runners_up) j["runners_up"].push_back(plan_json(r, cluster, model));
    if (runnable && runnable->found) j["best_runnable_today"] = plan_json(runnable->best, cluster, model);
    if (!async_points.empty()) {
      nlohmann::json points = nlohmann::json::array();
      for (const StalenessPoint& p : async_points)
        points.push_back({{"staleness", p.staleness}, {"sync_every", p.sync_every}, {"iteration_s", p.iteration_s},
                          {"speedup", p.speedup}});
      j["async"] = {{"placement", async_plan->plan.placement_name()}, {"describe", async_plan->plan.describe()},
                    {"by_staleness", points}};
    }
    if (cal) {
      j["calibration"] = cal->to_json();
      nlohmann::json speedups = nlohmann::json::array();
      for (const SpeedupCheck& s : async_speedups(*cal))
        speedups.push_back({{"staleness", s.staleness}, {"layout", s.layout}, {"measured", s.measured},
                            {"predicted", s.predicted}, {"error", s.error()}});
      j["calibration_async_speedups"] = speedups;
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    // A mixture of experts: every expert is held (memory), a token's num_experts_per_tok are computed (FLOPs).
    const std::string active = model.active_parameters(false) < model.parameters(false)
                                   ? ", " + count(model.active_parameters(false)) + " active per token"
                                   : "";
    std::printf("plan: %s with %s (%s parameters%s) on %d x %s (%d node%s of %d)\n", algorithm_name(workload.algorithm).c_str(),
                model.name.c_str(), count(model.parameters(false)).c_str(), active.c_str(), cluster.devices(),
                cluster.name.c_str(), cluster.nodes, cluster.nodes == 1 ? "" : "s", cluster.gpus_per_node);
    std::printf("  %" PRId64 " prompts x %" PRId64 ", %" PRId64 " prompt + %" PRId64 " response tokens, %" PRId64
                " epoch(s) x %" PRId64 " mini-batch(es), %s%s%s\n",
                workload.prompts, workload.samples_per_prompt, workload.prompt_length, workload.response_length,
                workload.ppo_epochs, workload.mini_batches, workload.param_bytes == 2 ? "bf16" : "fp32",
                workload.reward_model ? ", reward model" : ", rule reward",
                workload.reference ? "" : ", no reference model");
    std::printf("searched %" PRId64 " placements, %" PRId64 " device allocations, %" PRId64 " set layouts in %.3f s\n",
                result.placements, result.allocations, result.set_layouts, result.seconds);
    if (!result.found) {
      print_calibration();
      std::printf("no plan fits: every placement needs more memory than %d devices of %s have for this model and "
                  "batch (try more devices, shorter sequences or a smaller batch)\n",
                  cluster.devices(), human_bytes(cluster.usable_memory()).c_str());
      return 1;
    }
    std::printf("\nbest, %s\n", runnable_text(result.best.plan, model).c_str());
    print_plan(result.best, cluster);
    if (!result.runners_up.empty()) {
      std::printf("\nrunners-up (the best plan of each other placement):\n");
      int rank = 2;
      for (const auto& r : result.runners_up)
        std::printf("  %d. %-10s %-60s %8.2f s (%s) %s\n", rank++, r.plan.placement_name().c_str(), r.plan.describe().c_str(),
                    r.estimate.iteration_s, percent(r.estimate.iteration_s / result.best.estimate.iteration_s - 1).c_str(),
                    trainer_cannot_run(r.plan, TrainerCapabilities::today(), &model).empty() ? "runnable" : "");
    }
    if (runnable) {
      if (runnable->found)
        std::printf("\nbest plan hybridflow train runs today: %s %s, %.2f s (%s)\n",
                    runnable->best.plan.placement_name().c_str(), runnable->best.plan.describe().c_str(),
                    runnable->best.estimate.iteration_s,
                    percent(runnable->best.estimate.iteration_s / result.best.estimate.iteration_s - 1).c_str());
      else
        std::printf("\nno plan that hybridflow train runs today fits\n");
    }
    if (!async_points.empty()) print_async(*async_plan, async_points, o.staleness);
    print_calibration();
  }
  if (!o.write_config.empty()) {
    HF_CHECK(to_write != nullptr, "--write-config: no plan that hybridflow train runs today fits");
    write_file_atomic(o.write_config, trainer_config_fragment(to_write->plan, workload, TrainerCapabilities::today(), &model));
    if (!o.json)
      std::printf("\nwrote %s: %s %s\n", o.write_config.c_str(), to_write->plan.placement_name().c_str(),
                  to_write->plan.describe().c_str());
  }
  return 0;
}

}  // namespace

void add_plan_command(CLI::App& app, Action& action) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Find the fastest placement and parallel layout of an RL algorithm's models on a cluster (simulated); "
              "--calibrate measures this machine");
  cmd->add_option("--gpus", o->gpus, "devices to plan for");
  cmd->add_option("--gpus-per-node", o->gpus_per_node, "devices per node (default 8; this-machine: its cores)");
  cmd->add_option("--gpu", o->gpu, "a100-80g | h100 | h200 | this-machine (after --calibrate)")->capture_default_str();
  cmd->add_option("--model", o->model, "a model directory (config.json) or a published preset: " + model_preset_list(true))
      ->capture_default_str();
  cmd->add_option("--algorithm", o->algorithm, "ppo | grpo | remax | safe-rlhf")->capture_default_str();
  cmd->add_option("--batch", o->batch, "prompts per batch (data.train_batch_size)")->capture_default_str();
  cmd->add_option("--prompt-length", o->prompt_length)->capture_default_str();
  cmd->add_option("--response-length", o->response_length)->capture_default_str();
  cmd->add_option("--n", o->samples, "samples per prompt (rollout.n; 0: 8 for grpo, else 1)")->capture_default_str();
  cmd->add_option("--ppo-epochs", o->ppo_epochs)->capture_default_str();
  cmd->add_option("--mini-batches", o->mini_batches, "optimizer steps per epoch")->capture_default_str();
  cmd->add_option("--micro-batch", o->micro_batch, "sequences per device per micro-batch in updates")->capture_default_str();
  cmd->add_option("--forward-micro-batch", o->forward_micro_batch, "sequences per device per micro-batch in forward passes")
      ->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "bf16 | fp32 (default bf16 on GPUs, fp32 on this machine)");
  cmd->add_option("--reward-model", o->reward_model, "auto | on | off (auto: off for grpo)")->capture_default_str();
  cmd->add_option("--reference", o->reference,
                  "on | off: a reference model and its log-probs (off: a run without actor.use_kl_loss or "
                  "algorithm.use_kl_in_reward)")
      ->capture_default_str();
  cmd->add_flag("--no-distributed-optimizer", o->no_distributed_optimizer, "optimizer state not partitioned (ZeRO-1 off)");
  cmd->add_option("--staleness", o->staleness, "k >= 0: a standalone rollout may generate up to k steps ahead")
      ->capture_default_str();
  cmd->add_option("--sync-every", o->sync_every,
                  "weights synced to a standalone rollout every N updates (trigger_parameter_sync_step, 1 to k + 1)")
      ->capture_default_str();
  cmd->add_option("--max-num-seqs", o->max_num_seqs,
                  "sequences a generation replica decodes at once (rollout.max_num_seqs; 0: as many as its KV cache holds)")
      ->capture_default_str();
  cmd->add_option("--runners-up", o->runners_up)->capture_default_str();
  cmd->add_flag("--json", o->json, "one JSON object");
  cmd->add_option("--write-config", o->write_config, "write the best plan hybridflow train runs as a config fragment");
  cmd->add_flag("--calibrate", o->calibrate, "measure this machine and fit the simulator to small PPO runs");
  cmd->add_option("--calibration", o->calibration, "the calibration file (default $XDG_CACHE_HOME/hybridflow/calibration.json)");
  cmd->add_option("--calibrate-steps", o->calibrate_steps, "RL steps per calibration run")->capture_default_str();
  cmd->add_flag("--calibrate-quick", o->calibrate_quick, "smaller calibration runs (tests)");
  cmd->callback([o, &action] { action = [o] { return run_plan(*o); }; });
}

}  // namespace hybridflow::cli
