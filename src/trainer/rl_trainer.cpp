#include "hybridflow/trainer/rl_trainer.h"

#include <chrono>
#include <csignal>
#include <cstring>
#include <map>
#include <optional>

#include "hybridflow/core/progress.h"
#include "hybridflow/transport/process_pool.h"
#include "rl_stages.h"

namespace hybridflow {

namespace {

std::string shell_quote(const std::string& arg) {
  if (!arg.empty() && arg.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+=./:,@%") ==
                          std::string::npos)
    return arg;
  std::string out = "'";
  for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// This process's own command line, with what makes it continue from `checkpoint`: the same command already
// does under resume_mode auto (the run directory's newest checkpoint); otherwise resume_path is appended
// (later overrides win).
std::string resume_command(const TrainerRunSpec& trainer, const std::string& checkpoint) {
  std::string cmdline;
  if (file_exists("/proc/self/cmdline")) cmdline = read_file("/proc/self/cmdline");
  std::string out;
  for (size_t begin = 0; begin < cmdline.size();) {
    const size_t end = cmdline.find('\0', begin);
    out += (out.empty() ? "" : " ") + shell_quote(cmdline.substr(begin, end - begin));
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  if (out.empty()) out = "hybridflow train <the same config and overrides>";
  if (trainer.resume_mode != "auto")
    out += " trainer.resume_mode=resume_path " + shell_quote("trainer.resume_from_path=" + checkpoint);
  return out;
}

}  // namespace

RLTrainer::~RLTrainer() = default;

nlohmann::json RLTrainer::step() {
  State& s = *s_;
  if (s.run.profiler.profiles(s.step + 1)) s.start_profile(s.step + 1);
  TrainerStages stages(s);
  nlohmann::json record = get_rl_program(s.run.algorithm.program)(stages);
  HF_CHECK(stages.finished(), "algorithm program '", s.run.algorithm.program,
           "' returned without ending its step: its last line must be `return step.finish(batch);`");
  return record;
}

nlohmann::json RLTrainer::fit() {
  State& s = *s_;
  const int64_t total = s.run.trainer.total_steps;
  const int64_t every = s.run.trainer.log_every;
  nlohmann::json last;
  // The ETA is paced by this process's steps only: a resumed run's earlier steps took no time here.
  const auto start = std::chrono::steady_clock::now();
  const int64_t first_step = s.step;
  // A stop signal (enable_graceful_stop_on_signals) ends the run between steps; the checkpoint below still
  // follows, so the run can continue from exactly here.
  while (s.step < total && stop_requested_signal() == 0) {
    last = step();
    if (s.console_log && (s.step % every == 0 || s.step == total)) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::cerr << MetricsLog::format_progress(last, total,
                                               {"reward/mean", "score/mean", "val/score", "cost/mean", "lagrangian/lambda",
                                                "actor/ref_kl", "actor/ppo_kl", "actor/entropy", "actor/pg_loss",
                                                "critic/vf_loss", "response_length/mean", "timing/step_s",
                                                "perf/throughput_tokens_per_s"},
                                               eta_seconds(elapsed, s.step - first_step, total - s.step))
                << "\n";
    }
  }
  if (s.run.profiler.on) {
    s.finish_profiles();
    log_info("profile: the traces of steps ", nlohmann::json(s.run.profiler.steps).dump(), " are in ",
             s.run.profiler.save_path, "/step_<N>: ", s.run.profiler.trace ? "a Chrome trace and " : "",
             "a summary line per call and rank");
  }
  const bool save_at_end = s.run.trainer.saves();
  if (save_at_end && s.step > 0 && s.last_saved_step != s.step) s.save_checkpoint();
  s.save_lora_adapters();
  return last;
}

double RLTrainer::evaluate(int64_t count) { return s_->evaluate(count, s_->step); }

double RLTrainer::validate_before_training(int64_t count) {
  State& s = *s_;
  if (s.step > 0 || !s.metrics) return s.evaluate(count, s.step);
  MetricsLog& m = *s.metrics;
  const double score = s.evaluate(count, 0, &m);
  m.set("val/score", score);
  m.end_step(0);
  return score;
}

double RLTrainer::State::evaluate(int64_t count, int64_t at_step, MetricsLog* metrics_out) {
  count = std::min<int64_t>(count, static_cast<int64_t>(test.size()));
  HF_CHECK(count > 0, "evaluate: no held-out examples (data.test_size or data.test_file)");
  int64_t pos = 0;
  DataProto prompts = next_prompts(count, test, &pos, /*shuffle=*/false);
  const TrainerRunSpec::ValKwargs& v = run.trainer.val_kwargs;
  prompts.meta()["n"] = v.n;
  if (v.do_sample) {  // the same draws for the same weights: a seed of the run and the step
    prompts.meta()["temperature"] = v.temperature;
    prompts.meta()["top_k"] = v.top_k;
    prompts.meta()["top_p"] = v.top_p;
    prompts.meta()["seed"] = run.trainer.seed * 100003ULL + static_cast<uint64_t>(at_step) + 0x5a11ULL;
  } else {
    prompts.meta()["greedy"] = true;
  }
  const int procs = generator().world_size();
  int64_t pad = 0;
  if (count % procs != 0) prompts = prompts.padded_to_multiple(procs, &pad);
  // A prompt's n responses are consecutive rows: the padding prompts' come last.
  DataProto gen =
      surviving_rollout_deaths(generator().call("generate_sequences", prompts), prompts).get().slice(0, count * v.n);
  const auto scores = rule_scores(gen);
  log_validation(gen, scores, at_step);
  if (metrics_out) add_validation_metrics(gen, scores, v.n, *metrics_out);
  double total = 0;
  for (double s : scores) total += s;
  return total / static_cast<double>(scores.size());
}

// verl's per-source validation metrics: val-core/<data_source>/reward/mean@<n>, the mean score of every
// response; with n > 1 also .../max@<n> and .../min@<n>, the mean over prompts of the best and the worst of
// their n responses (exact over these n; verl's best@N is a bootstrap estimate).
void RLTrainer::State::add_validation_metrics(const DataProto& gen, const std::vector<double>& scores, int64_t n,
                                             MetricsLog& out) const {
  struct Source {
    double sum = 0, best = 0, worst = 0;
    int64_t responses = 0, prompts = 0;
  };
  std::map<std::string, Source> sources;
  const auto& data_sources = gen.field("data_source");
  for (size_t first = 0; first < scores.size(); first += static_cast<size_t>(n)) {
    Source& s = sources[data_sources[first].get<std::string>()];
    double best = scores[first], worst = scores[first];
    for (size_t i = first; i < first + static_cast<size_t>(n); ++i) {
      s.sum += scores[i];
      best = std::max(best, scores[i]);
      worst = std::min(worst, scores[i]);
    }
    s.responses += n;
    s.prompts += 1;
    s.best += best;
    s.worst += worst;
  }
  const std::string at = "@" + std::to_string(n);
  for (const auto& [name, s] : sources) {
    const std::string key = "val-core/" + name + "/reward/";
    out.set(key + "mean" + at, s.sum / static_cast<double>(s.responses));
    if (n == 1) continue;
    out.set(key + "max" + at, s.best / static_cast<double>(s.prompts));
    out.set(key + "min" + at, s.worst / static_cast<double>(s.prompts));
  }
}

void RLTrainer::State::log_validation(const DataProto& gen, const std::vector<double>& scores, int64_t at_step) {
  const std::string& dir = run.trainer.validation_data_dir;
  const auto logged = static_cast<size_t>(std::min<int64_t>(run.trainer.log_val_generations, gen.batch_size()));
  if (dir.empty() && logged == 0) return;
  // Only the logged rows are decoded when nothing goes to a file.
  auto responses = decode_responses(dir.empty() ? gen.slice(0, static_cast<int64_t>(logged)) : gen);
  const at::Tensor score_tensor = torch::tensor(scores, torch::kDouble);
  std::vector<RolloutSample> samples;
  std::vector<nlohmann::json> records;
  for (size_t i = 0; i < responses.size(); ++i) {
    samples.push_back(rollout_sample(gen, score_tensor, static_cast<int64_t>(i), std::move(responses[i])));
    records.push_back(generation_record(at_step, samples.back(), /*trained=*/false));
  }
  if (!dir.empty()) write_generations(dir, at_step, records);
  // The same first prompts every time (the held-out order is fixed), so the logged responses show the
  // policy's progress on them, as verl's fixed-seed choice does.
  if (logged > 0 && metrics) {
    samples.resize(logged);
    records.resize(logged);
    metrics->add_val_generations(at_step, records, rollout_samples_markdown(samples));
  }
}

std::vector<std::string> RLTrainer::roles() const {
  std::vector<std::string> out;
  for (const auto* g : {s_->actor.get(), s_->critic.get(), s_->reward_model.get(), s_->cost_model.get(),
                        s_->cost_critic.get(), s_->rollout.get()})
    if (g) out.push_back(g->role());
  return out;
}

int64_t RLTrainer::steps_done() const { return s_->step; }
const RunSpec& RLTrainer::spec() const { return s_->run; }

std::string RLTrainer::save_checkpoint() { return s_->save_checkpoint(); }

const std::string& RLTrainer::resumed_from() const { return s_->resumed_from; }

const std::string& RLTrainer::last_checkpoint() const { return s_->last_checkpoint; }

double RLTrainer::parameter_sq_norm(const std::string& role) {
  WorkerGroup* g = role == "actor"         ? s_->actor.get()
                  : role == "critic"      ? s_->critic.get()
                  : role == "cost_critic" ? s_->cost_critic.get()
                  : role == "rollout"     ? s_->rollout.get()
                                          : nullptr;
  HF_CHECK(g, "parameter_sq_norm: no worker group '", role, "' (started: actor",
           s_->critic ? ", critic" : "", ")");
  return g->call("parameter_norm").get().tensor("param_sq_norm")[0].item<double>();
}

int run_rl_training(const Config& config) {
  // The first Ctrl-C / SIGTERM stops after the current step (and checkpoints); a second one kills at once.
  enable_graceful_stop_on_signals();
  RLTrainer trainer(config);
  const int64_t test_size = trainer.spec().data.test_size;
  const TrainerRunSpec& spec = trainer.spec().trainer;
  std::optional<double> before;  // verl's val_before_train: also at a resume's first step
  if (test_size > 0 && (spec.val_before_train || spec.val_only) && stop_requested_signal() == 0)
    before = trainer.validate_before_training(test_size);
  const char* when = trainer.resumed_from().empty() ? "before " : "at resume ";
  // What the score is a mean of: greedy responses unless val_kwargs samples.
  const TrainerRunSpec::ValKwargs& v = spec.val_kwargs;
  const std::string how = v.do_sample ? std::to_string(v.n) + " sampled per prompt" : std::string("greedy");
  if (spec.val_only) {
    if (before) std::cerr << "held-out score (" << how << ", " << test_size << " prompts): " << when << *before << "\n";
    return before ? 0 : 128 + stop_requested_signal();
  }
  trainer.fit();
  if (const int sig = stop_requested_signal()) {
    const int64_t total = trainer.spec().trainer.total_steps;
    std::cerr << "stopped by " << (sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : strsignal(sig))
              << " after step " << trainer.steps_done() << " of " << total << "\n";
    const std::string& ckpt = trainer.last_checkpoint();
    if (ckpt.empty())
      std::cerr << "no checkpoint was written, so this run cannot be resumed (trainer.save_freq or "
                   "trainer.save_checkpoint, with trainer.run_dir, make a stopped run resumable)\n";
    else
      std::cerr << "checkpoint: " << ckpt
                << (ckpt.ends_with("/" + checkpoint_name(trainer.steps_done()))
                        ? ""
                        : " (older than this step: saving is off, so resuming repeats the steps after it)")
                << "\nresume with: " << resume_command(trainer.spec().trainer, ckpt) << "\n";
    return 128 + sig;  // what a shell reports for a process the signal ended: 130 for SIGINT, 143 for SIGTERM
  }
  if (test_size > 0) {
    const double after = trainer.evaluate(test_size);
    std::cerr << "held-out score (" << how << "): ";
    if (before) std::cerr << when << *before << ", ";
    std::cerr << "after " << after << "\n";
  }
  if (!trainer.last_checkpoint().empty()) std::cerr << "checkpoint: " << trainer.last_checkpoint() << "\n";
  return 0;
}

}  // namespace hybridflow
