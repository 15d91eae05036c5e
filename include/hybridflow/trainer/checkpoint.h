// Checkpoint directories of an RL run and how a crash can never make a partial one look complete:
//   <run_dir>/checkpoints/step_<N>/   one checkpoint (workers' files: workers/checkpoint_io.h;
//                                     trainer_state.json: step, data position, KL coefficient, ...)
//   <run_dir>/checkpoints/latest      the name of the newest complete one ("step_<N>")
// A checkpoint is written into ".step_<N>.tmp", gets its COMPLETE marker last, and is then renamed to
// step_<N>; `latest` is replaced atomically after the rename. Readers only accept directories with the
// marker, so a crash at any point leaves either the previous checkpoint or the new one.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hybridflow/core/config.h"
#include "hybridflow/trainer/run_spec.h"

namespace hybridflow {

inline constexpr const char* kCheckpointCompleteFile = "COMPLETE";
inline constexpr const char* kCheckpointLatestFile = "latest";
inline constexpr const char* kTrainerStateFile = "trainer_state.json";

std::string checkpoints_root(const std::string& run_dir);  // <run_dir>/checkpoints
std::string checkpoint_name(int64_t step);                 // step_<N>

// A fresh, empty temporary directory for the checkpoint of `step` (a leftover from a crash is removed).
std::string begin_checkpoint(const std::string& root, int64_t step);
// Writes the marker into `tmp_dir`, renames it to step_<N> (replacing an older one of that step) and
// points `latest` at it. Returns the final directory.
std::string commit_checkpoint(const std::string& root, int64_t step, const std::string& tmp_dir);
// Removes all but the newest `keep` complete checkpoints (keep <= 0: none removed) and stale temporaries.
// Returns how many were removed.
int remove_old_checkpoints(const std::string& root, int64_t keep);

bool is_complete_checkpoint(const std::string& dir);
// The newest complete checkpoint under `root`: the one `latest` names when it is complete, else the
// highest complete step_<N>; nullopt when there is none (or no root).
std::optional<std::string> find_latest_checkpoint(const std::string& root);
// Complete checkpoints under `root`, highest step first.
std::vector<std::string> complete_checkpoints_newest_first(const std::string& root);

// What is wrong with checkpoint `dir` ("" when it looks intact): the marker, trainer_state.json, the
// controller's files and each trained role's files must be there, every safetensors header must fit its
// file's size and every JSON file must parse. Reads headers only, not the tensors (checkpoint_check.cpp).
std::string checkpoint_problem(const std::string& dir);
// The newest intact checkpoint under `root` (`latest` first, then by step), warning for each damaged one
// it passes over and what is wrong with it (also appended to `problems`); nullopt when there is none.
std::optional<std::string> find_intact_checkpoint(const std::string& root, std::vector<std::string>* problems = nullptr);

// A checkpoint to resume from, given a checkpoint directory, a checkpoints root (with `latest`) or a
// run directory: for a root, the newest intact one (falling back past damaged ones with a warning); a
// named checkpoint directory must be intact itself. Errors name the missing marker / directory / damage.
std::string resolve_checkpoint(const std::string& path);

// The checkpoint a run starts from (the keys checked in the run spec): resume_mode disable -> ""; auto ->
// the newest intact checkpoint of run_dir ("" when there is none; an error when all are damaged);
// resume_path -> resolve_checkpoint of resume_from_path. Errors name the key.
std::string checkpoint_to_resume(const TrainerRunSpec& trainer);

// trainer_state.json: written atomically; reading checks that it is a JSON object with the keys the
// resume needs, naming the file and key on error.
void write_trainer_state(const std::string& dir, const nlohmann::json& state);
nlohmann::json read_trainer_state(const std::string& dir);

}  // namespace hybridflow
