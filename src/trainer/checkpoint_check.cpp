// Checking a complete checkpoint before resuming from it (trainer/checkpoint.h): the COMPLETE marker says
// the save finished, but a disk that filled up later, a copy cut short or a stray edit can still damage a
// file, and a resume that fails halfway through loading the workers is worse than one that starts from the
// previous intact checkpoint.
#include <filesystem>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/logging.h"
#include "hybridflow/model/safetensors.h"
#include "hybridflow/trainer/checkpoint.h"

namespace hybridflow {

namespace fs = std::filesystem;

namespace {

// The role's optimizer state: the whole-tensor file, or the per-layout .pt files of older checkpoints.
bool has_optimizer_state(const std::string& dir, const std::string& role) {
  if (file_exists(dir + "/" + role + "_optim.safetensors")) return true;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(role + "_optim") && name.ends_with(".pt")) return true;
  }
  return false;
}

}  // namespace

std::string checkpoint_problem(const std::string& dir) {
  if (!is_complete_checkpoint(dir)) return dir + "/" + kCheckpointCompleteFile + " is missing";
  nlohmann::json state;
  try {
    state = read_trainer_state(dir);
  } catch (const Error& e) {
    return e.what();
  }
  std::vector<std::string> required = {"config.yaml", "rng/controller.safetensors"};
  for (const auto& role : state["roles"]) {
    if (!role.is_string()) return dir + "/" + kTrainerStateFile + ": 'roles' holds a non-string " + role.dump();
    const std::string name = role.get<std::string>();
    required.push_back(name + "/config.json");
    required.push_back(name + "/model.safetensors");
    if (!has_optimizer_state(dir, name)) return dir + "/" + name + "_optim.safetensors is missing";
  }
  for (const auto& file : required)
    if (!file_exists(dir + "/" + file)) return dir + "/" + file + " is missing";
  // Every file whose format can be checked without loading it: safetensors headers against the file size
  // (map_safetensors reads no tensor data), JSON by parsing.
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (!it->is_regular_file()) continue;
    const std::string path = it->path().string();
    try {
      if (path.ends_with(".safetensors")) map_safetensors(path);
      if (path.ends_with(".json") && !nlohmann::json::accept(read_file(path))) return path + ": not valid JSON";
    } catch (const Error& e) {
      return e.what();
    }
  }
  if (ec) return dir + ": cannot list its files: " + ec.message();
  return "";
}

std::optional<std::string> find_intact_checkpoint(const std::string& root, std::vector<std::string>* problems) {
  std::vector<std::string> candidates;
  if (auto latest = find_latest_checkpoint(root)) candidates.push_back(*latest);
  for (const auto& dir : complete_checkpoints_newest_first(root))
    if (candidates.empty() || dir != candidates.front()) candidates.push_back(dir);
  for (size_t i = 0; i < candidates.size(); ++i) {
    const std::string problem = checkpoint_problem(candidates[i]);
    if (problem.empty()) return candidates[i];
    if (problems) problems->push_back(candidates[i] + ": " + problem);
    log_warn("checkpoint ", candidates[i], " is damaged (", problem, "); ",
             i + 1 < candidates.size() ? "trying the previous one, " + candidates[i + 1] : std::string("none left"));
  }
  return std::nullopt;
}

}  // namespace hybridflow
