// Internal to trainer/: the run's spec (trainer/run_spec.h), built once from the configuration. Every
// check and every default of the trainer, data, algorithm and scoring keys is here, and nowhere else: the
// step, the stages, the programs and the checkpoint code use the spec's fields.
//
// Like the role specs (role_spec_builders.h), each part reads through a ConfigReader and notes its keys
// under its name ("trainer", "data", "algorithm", "scoring") in `keys`; tests/trainer/test_role_spec_keys.cpp
// holds them, with the roles', against docs/configuration.md.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config_reader.h"
#include "role_spec_builders.h"
#include "hybridflow/trainer/run_spec.h"

namespace hybridflow {

// `keys` (may be null) gets the keys each part read.
RunSpec build_run_spec(const Config& config, RoleSpecKeys* keys = nullptr);

// The run spec's readers of keys that load_rl_config's verl derivations (trainer/verl_keys.h) need before
// any spec is built, so that those keys keep this one reader: the data part (noted under "data") and
// trainer.nnodes (null: unset; read through the trainer part's reader).
DataSpec build_data_spec(const Config& config, RoleSpecKeys* keys = nullptr);
std::optional<int64_t> run_spec_nnodes(const ConfigReader& trainer);

// verl_derived_overrides (trainer/verl_keys.h), noting the verl keys it reads under "verl" in `keys` (and
// the data and trainer keys it takes through the readers above under theirs).
std::vector<std::string> verl_derived_overrides(const Config& config, RoleSpecKeys* keys);

// verl's custom_reward_function (a Python file's compute_score; custom_reward_function.cpp) as the reward command
// that runs it, with `reward`'s limits; nullopt when custom_reward_function.path is null. An error when reward.*
// chooses another scorer too.
std::optional<RewardFunctionSpec> custom_reward_function_spec(const ConfigReader& c, const RewardFunctionSpec& reward);

// The program a configuration runs (algorithm.program, or chosen from the other keys for `auto`), read
// through `c`; trainer/rl_program.h's rl_program_name is this on a Config.
std::string resolve_rl_program(const ConfigReader& c, const std::string& adv_estimator, bool has_cost);

}  // namespace hybridflow
