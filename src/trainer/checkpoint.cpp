#include "hybridflow/trainer/checkpoint.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <vector>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/remove_tree.h"

namespace hybridflow {

namespace fs = std::filesystem;

namespace {

const std::string kStepPrefix = "step_";

// N for a directory named step_<N>, else -1.
int64_t step_of(const std::string& name) {
  if (name.compare(0, kStepPrefix.size(), kStepPrefix) != 0 || name.size() == kStepPrefix.size()) return -1;
  const std::string digits = name.substr(kStepPrefix.size());
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) || digits.size() > 18)
    return -1;
  return std::stoll(digits);
}

// Complete checkpoints under root, oldest first.
std::vector<std::pair<int64_t, std::string>> complete_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const int64_t step = step_of(entry.path().filename().string());
    if (step >= 0 && is_complete_checkpoint(entry.path().string())) out.emplace_back(step, entry.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t b = 0;
  while (b < s.size() && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  return s.substr(b);
}

void remove_dir(const std::string& dir) {
  const std::string failure = remove_tree(dir);
  HF_CHECK(failure.empty(), "could not remove ", dir, ": ", failure);
}

}  // namespace

std::string checkpoints_root(const std::string& run_dir) { return run_dir + "/checkpoints"; }

std::string checkpoint_name(int64_t step) { return kStepPrefix + std::to_string(step); }

std::string begin_checkpoint(const std::string& root, int64_t step) {
  const std::string tmp = root + "/." + checkpoint_name(step) + ".tmp";
  remove_dir(tmp);
  make_dirs(tmp);
  return tmp;
}

std::string commit_checkpoint(const std::string& root, int64_t step, const std::string& tmp_dir) {
  write_file_atomic(tmp_dir + "/" + kCheckpointCompleteFile, nlohmann::json({{"step", step}}).dump() + "\n");
  const std::string final_dir = root + "/" + checkpoint_name(step);
  // A directory cannot be renamed over a non-empty one: move an older checkpoint of this step aside first.
  std::error_code ec;
  if (fs::exists(final_dir, ec)) {
    const std::string old = root + "/." + checkpoint_name(step) + ".old";
    remove_dir(old);
    fs::rename(final_dir, old, ec);
    HF_CHECK(!ec, "could not move the previous checkpoint ", final_dir, " aside: ", ec.message());
  }
  fs::rename(tmp_dir, final_dir, ec);
  HF_CHECK(!ec, "could not rename checkpoint ", tmp_dir, " to ", final_dir, ": ", ec.message());
  write_file_atomic(root + "/" + kCheckpointLatestFile, checkpoint_name(step) + "\n");
  return final_dir;
}

int remove_old_checkpoints(const std::string& root, int64_t keep) {
  int removed = 0;
  std::error_code ec;
  if (fs::is_directory(root, ec)) {
    // Only this run writes here and no save is in progress when this runs, so dot-entries are leftovers.
    std::vector<std::string> stale;
    for (const auto& entry : fs::directory_iterator(root, ec)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_directory() && name.rfind("." + kStepPrefix, 0) == 0) stale.push_back(entry.path().string());
    }
    for (const auto& dir : stale) remove_dir(dir);
  }
  if (keep <= 0) return 0;
  auto ckpts = complete_checkpoints(root);
  for (size_t i = 0; i + static_cast<size_t>(keep) < ckpts.size(); ++i) {
    // Drop the marker first: if removal is interrupted, the rest is not mistaken for a checkpoint.
    fs::remove(ckpts[i].second + "/" + kCheckpointCompleteFile, ec);
    remove_dir(ckpts[i].second);
    ++removed;
  }
  return removed;
}

bool is_complete_checkpoint(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir + "/" + kCheckpointCompleteFile, ec);
}

std::optional<std::string> find_latest_checkpoint(const std::string& root) {
  const std::string latest = root + "/" + kCheckpointLatestFile;
  if (file_exists(latest)) {
    const std::string name = trim(read_file(latest));
    if (step_of(name) >= 0 && is_complete_checkpoint(root + "/" + name)) return root + "/" + name;
  }
  auto ckpts = complete_checkpoints(root);
  if (ckpts.empty()) return std::nullopt;
  return ckpts.back().second;
}

std::vector<std::string> complete_checkpoints_newest_first(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& [step, dir] : complete_checkpoints(root)) out.insert(out.begin(), dir);
  return out;
}

namespace {

// The newest intact checkpoint under `root`, nullopt when it holds no complete one; an error when it holds
// complete ones but every one is damaged (naming what is wrong with each).
std::optional<std::string> intact_checkpoint_under(const std::string& root, const std::string& how_to_start_fresh) {
  if (!find_latest_checkpoint(root)) return std::nullopt;
  std::vector<std::string> problems;
  auto found = find_intact_checkpoint(root, &problems);
  if (found) return found;
  std::string list;
  for (const auto& p : problems) list += "\n  " + p;
  HF_FAIL("every checkpoint under ", root, " is damaged; remove them", how_to_start_fresh, ":", list);
}

}  // namespace

std::string resolve_checkpoint(const std::string& path) {
  std::error_code ec;
  HF_CHECK(fs::is_directory(path, ec), "checkpoint directory ", path, " does not exist");
  if (is_complete_checkpoint(path)) {
    const std::string problem = checkpoint_problem(path);
    HF_CHECK(problem.empty(), "checkpoint ", path, " is damaged: ", problem,
             "; resume from an earlier checkpoint (its checkpoints directory picks the newest intact one)");
    return path;
  }
  HF_CHECK(!file_exists(path + "/" + kTrainerStateFile) && step_of(fs::path(path).filename().string()) < 0,
           "checkpoint ", path, " is incomplete: ", path, "/", kCheckpointCompleteFile,
           " is missing (the save was interrupted); resume from an earlier checkpoint");
  for (const std::string& root : {path, checkpoints_root(path)})
    if (auto found = intact_checkpoint_under(root, "")) return *found;
  HF_FAIL("no complete checkpoint in ", path, " (looked for step_<N>/", kCheckpointCompleteFile, " there and in ",
          checkpoints_root(path), ")");
}

std::string checkpoint_to_resume(const TrainerRunSpec& trainer) {
  const std::string& mode = trainer.resume_mode;
  const std::string& path = trainer.resume_from_path;
  if (mode == "resume_path") {
    HF_CHECK(!path.empty(), "trainer.resume_mode=resume_path needs trainer.resume_from_path (a checkpoint, ",
             "checkpoints or run directory)");
    return resolve_checkpoint(path);
  }
  const std::string& run_dir = trainer.run_dir;
  if (mode == "disable" || run_dir.empty()) return "";
  return intact_checkpoint_under(checkpoints_root(run_dir), " or set trainer.resume_mode=disable to start afresh")
      .value_or("");
}

void write_trainer_state(const std::string& dir, const nlohmann::json& state) {
  write_file_atomic(dir + "/" + kTrainerStateFile, state.dump(2) + "\n");
}

nlohmann::json read_trainer_state(const std::string& dir) {
  const std::string file = dir + "/" + kTrainerStateFile;
  HF_CHECK(file_exists(file), "checkpoint ", dir, ": ", file, " is missing");
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(read_file(file));
  } catch (const nlohmann::json::exception& e) {
    HF_FAIL(file, ": not valid JSON (", e.what(), ")");
  }
  HF_CHECK(state.is_object(), file, ": expected a JSON object, got ", state.type_name());
  for (const char* key : {"step", "data_pos"})
    HF_CHECK(state.contains(key) && state[key].is_number_integer() && state[key].get<int64_t>() >= 0, file,
             ": '", key, "' must be a non-negative integer");
  HF_CHECK(state.contains("roles") && state["roles"].is_array(), file, ": 'roles' must be an array of role names");
  return state;
}

}  // namespace hybridflow
