// Saving and resuming an RL run: the controller's own state next to each trained role's files
// (layout in trainer/checkpoint.h and workers/checkpoint_io.h).
#include "rl_trainer_state.h"

namespace hybridflow {

std::vector<WorkerGroup*> RLTrainer::State::trainable_groups() const {
  std::vector<WorkerGroup*> out = {actor.get()};
  if (critic) out.push_back(critic.get());
  if (cost_critic) out.push_back(cost_critic.get());
  return out;
}

nlohmann::json RLTrainer::State::controller_state() const {
  nlohmann::json roles = nlohmann::json::array();
  for (const WorkerGroup* g : trainable_groups()) roles.push_back(g->role());
  // Sampling and shuffling seeds derive from trainer.seed and the step counters saved here and in the
  // optimizer states; seed is kept to warn when a resumed run changes it.
  nlohmann::json state = {{"step", step},
                          {"data_pos", data_pos},
                          {"kl_coef", kl_ctrl.value()},
                          {"roles", roles},
                          {"seed", static_cast<int64_t>(run.trainer.seed)},
                          {"adv_estimator", run.algorithm.adv_estimator}};
  if (lagrange) state["lagrange_lambda"] = lagrange->value();
  return state;
}

void RLTrainer::State::restore_controller_state(const nlohmann::json& state, const std::string& file) {
  nlohmann::json roles = nlohmann::json::array();
  for (const WorkerGroup* g : trainable_groups()) roles.push_back(g->role());
  HF_CHECK(state.at("roles") == roles, file, ": the checkpoint holds roles ", state.at("roles").dump(),
           " but this run trains ", roles.dump(), " (algorithm.adv_estimator ", run.algorithm.adv_estimator, ")");
  HF_CHECK(state.contains("kl_coef") && state["kl_coef"].is_number(), file, ": 'kl_coef' must be a number");
  if (state.contains("seed") && state["seed"] != static_cast<int64_t>(run.trainer.seed))
    log_warn(file, ": saved with trainer.seed ", state["seed"].dump(), ", resuming with ",
             run.trainer.seed, "; the resumed run will not match an uninterrupted one");
  step = state.at("step").get<int64_t>();
  data_pos = state.at("data_pos").get<int64_t>();
  HF_CHECK(!lagrange == !state.contains("lagrange_lambda"), file, ": the checkpoint ",
           lagrange ? "has no Safe-RLHF multiplier 'lagrange_lambda'" : "is of a Safe-RLHF run",
           " but this run ", lagrange ? "uses" : "does not use", " a cost (cost.type / cost_model.enable)");
  if (lagrange) {
    // The multiplier steps once per training step: continuing from the saved lambda, with the delay
    // shortened by the steps already taken, is exactly where the interrupted run was.
    algo::LagrangeConfig lc = *run.algorithm.safe_rlhf;
    lc.lambda_init = state.at("lagrange_lambda").get<double>();
    lc.update_delay_steps = static_cast<int>(std::max<int64_t>(0, lc.update_delay_steps - step));
    lagrange.emplace(lc);
  }
  const AlgorithmSpec::KlCtrl& kl = run.algorithm.kl_ctrl;
  kl_ctrl = algo::KlController::from_config(kl.type, state["kl_coef"].get<double>(), kl.target_kl, kl.horizon);
}

std::string RLTrainer::State::save_checkpoint() {
  const std::string& run_dir = run.trainer.run_dir;
  HF_CHECK(!run_dir.empty(), "trainer.save_checkpoint / trainer.save_freq need trainer.run_dir");
  const std::string root = checkpoints_root(run_dir);
  const std::string tmp = begin_checkpoint(root, step);
  make_dirs(tmp + "/rng");
  const std::string tok_path = tmp + "/tokenizer.json";
  tokenizer.save(tok_path);
  DataProto req;
  req.meta()["dir"] = tmp;
  req.meta()["tokenizer"] = tok_path;
  // The rollouts in flight stop while the roles save; save_prefetch keeps what they drew and lets them go on.
  pause_partial_rollouts();
  try {
    std::vector<Future> saves;
    for (WorkerGroup* g : trainable_groups()) saves.push_back(g->call("save_checkpoint", req));
    for (const Future& f : saves) f.get();
    save_prefetch(tmp);
  } catch (...) {
    resume_partial_rollouts();
    throw;
  }
  save_cpu_rng_state(tmp + "/rng/controller.safetensors");
  write_file_atomic(tmp + "/config.yaml", cfg.to_yaml());
  write_trainer_state(tmp, controller_state());
  last_checkpoint = commit_checkpoint(root, step, tmp);
  last_saved_step = step;
  const int removed = remove_old_checkpoints(root, run.trainer.max_ckpt_to_keep);
  log_info("saved checkpoint ", last_checkpoint, removed ? " (removed " + std::to_string(removed) + " older)" : "");
  return last_checkpoint;
}

void RLTrainer::State::save_lora_adapters() {
  const std::string& run_dir = run.trainer.run_dir;
  if (run_dir.empty()) return;
  std::vector<std::pair<WorkerGroup*, std::string>> roles;
  if (specs.actor.model.uses_lora()) roles.emplace_back(actor.get(), "actor");
  if (critic && specs.critic && specs.critic->model.uses_lora()) roles.emplace_back(critic.get(), "critic");
  if (cost_critic && specs.cost_critic && specs.cost_critic->model.uses_lora())
    roles.emplace_back(cost_critic.get(), "cost_critic");
  for (const auto& [group, role] : roles) {
    DataProto req;
    req.meta()["dir"] = run_dir + "/lora_adapter/" + role;
    req.meta()["base"] = model.path.empty() ? model.preset : model.path;
    group->call("save_lora_adapter", req).get();
    log_info("saved the ", role, "'s LoRA adapters to ", run_dir, "/lora_adapter/", role);
  }
}

void RLTrainer::State::resume(const std::string& dir) {
  // The controller's state first: it checks that the checkpoint fits this run before workers load it.
  restore_controller_state(read_trainer_state(dir), dir + "/" + kTrainerStateFile);
  DataProto req;
  req.meta()["dir"] = dir;
  std::vector<Future> loads;
  for (WorkerGroup* g : trainable_groups()) loads.push_back(g->call("load_checkpoint", req));
  for (const Future& f : loads) f.get();
  load_prefetch(dir);
  load_cpu_rng_state(dir + "/rng/controller.safetensors");
  resumed_from = last_checkpoint = dir;
  last_saved_step = step;
  const int64_t dropped = metrics->drop_steps_after(step);
  log_info("resumed from checkpoint ", dir, " at step ", step,
           dropped ? " (dropped " + std::to_string(dropped) + " metrics lines written after it)" : "");
}

}  // namespace hybridflow
