// Checkpoints of the fine-tuning loops and their resumption; see finetune/fine_tune_checkpoint.h.
#include "hybridflow/finetune/fine_tune_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <utility>
#include <vector>
#include <map>
#include <nlohmann/json.hpp>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/jsonl.h"
#include "hybridflow/core/logging.h"
#include "hybridflow/core/remove_tree.h"
#include "hybridflow/model/lora.h"
#include "hybridflow/model/pretrained.h"

namespace hybridflow {

namespace {

constexpr const char* kCheckpointPrefix = "checkpoint-";
constexpr const char* kOptimizerFile = "/optimizer.pt";

// The step of a directory named checkpoint-<step> holding an optimizer state (-1: not a complete checkpoint).
int64_t checkpoint_step(const std::filesystem::path& dir) {
  const std::string name = dir.filename().string();
  if (!name.starts_with(kCheckpointPrefix)) return -1;
  const std::string digits = name.substr(std::string(kCheckpointPrefix).size());
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  if (!file_exists(dir.string() + kOptimizerFile)) return -1;
  return std::stoll(digits);
}

// A checkpoint directory as given (a trailing slash or "." parts allowed), as checkpoint_step reads it.
std::filesystem::path normalized_dir(const std::string& dir) {
  std::filesystem::path path = std::filesystem::path(dir).lexically_normal();
  return path.filename().empty() ? path.parent_path() : path;
}

}  // namespace

std::string checkpoint_dir(const std::string& out_dir, int64_t step) {
  return out_dir + "/" + kCheckpointPrefix + std::to_string(step);
}

std::string save_fine_tune_checkpoint(const std::string& out_dir, int64_t step, const CausalLM& model,
                                      const Tokenizer& tokenizer, const TrainEngine& engine) {
  namespace fs = std::filesystem;
  const std::string final_dir = checkpoint_dir(out_dir, step);
  const std::string tmp_dir = final_dir + ".tmp";
  std::string failure = remove_tree(tmp_dir);
  HF_CHECK(failure.empty(), "could not remove the unfinished checkpoint ", failure);
  make_dirs(tmp_dir);
  save_pretrained(tmp_dir, model, tokenizer);  // with LoRA the base model, the adapters beside it
  if (model->has_lora()) save_lora_adapter(tmp_dir + "/lora_adapter", model, final_dir);
  engine.save_state(tmp_dir + kOptimizerFile);
  failure = remove_tree(final_dir);
  HF_CHECK(failure.empty(), "could not replace the checkpoint ", failure);
  std::error_code ec;
  fs::rename(tmp_dir, final_dir, ec);
  HF_CHECK(!ec, "could not rename checkpoint '", tmp_dir, "' to '", final_dir, "': ", ec.message());
  return final_dir;
}

int64_t save_final_model(const std::string& final_dir, const std::string& checkpoint, const CausalLM& model,
                         const Tokenizer& tokenizer) {
  namespace fs = std::filesystem;
  const std::string tmp_dir = final_dir + ".tmp";
  std::string failure = remove_tree(tmp_dir);
  HF_CHECK(failure.empty(), "could not remove the unfinished model directory ", failure);
  make_dirs(tmp_dir);
  int64_t linked = 0;
  std::error_code ec;
  if (!checkpoint.empty() && checkpoint_step(normalized_dir(checkpoint)) >= 0) {
    // The model's files are the checkpoint's top-level files but its optimizer state; its LoRA adapters name
    // the checkpoint as their base, so the caller writes the final ones itself.
    for (const auto& entry : fs::directory_iterator(checkpoint, ec)) {
      if (!entry.is_regular_file() || "/" + entry.path().filename().string() == kOptimizerFile) continue;
      fs::create_hard_link(entry.path(), fs::path(tmp_dir) / entry.path().filename(), ec);
      if (ec) break;
      ++linked;
    }
    HF_CHECK(!ec || linked == 0, "could not link '", checkpoint, "' into '", tmp_dir, "': ", ec.message());
  }
  if (linked == 0) save_pretrained(tmp_dir, model, tokenizer);  // no checkpoint, or no links on this filesystem
  failure = remove_tree(final_dir);
  HF_CHECK(failure.empty(), "could not replace the model directory ", failure);
  fs::rename(tmp_dir, final_dir, ec);
  HF_CHECK(!ec, "could not rename '", tmp_dir, "' to '", final_dir, "': ", ec.message());
  return linked;
}

std::string latest_fine_tune_checkpoint(const std::string& out_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (out_dir.empty() || !fs::is_directory(out_dir, ec)) return "";
  int64_t best = -1;
  std::string found;
  for (const auto& entry : fs::directory_iterator(out_dir, ec)) {
    const int64_t step = entry.is_directory() ? checkpoint_step(entry.path()) : -1;
    if (step > best) {
      best = step;
      found = entry.path().string();
    }
  }
  return found;
}

int64_t remove_old_fine_tune_checkpoints(const std::string& out_dir, int64_t keep) {
  namespace fs = std::filesystem;
  HF_CHECK(keep >= 1, "trainer.max_ckpt_to_keep: keep at least 1 checkpoint, got ", keep);
  std::error_code ec;
  if (out_dir.empty() || !fs::is_directory(out_dir, ec)) return 0;
  std::vector<std::pair<int64_t, std::string>> found;
  for (const auto& entry : fs::directory_iterator(out_dir, ec)) {
    const int64_t step = entry.is_directory() ? checkpoint_step(entry.path()) : -1;
    if (step >= 0) found.emplace_back(step, entry.path().string());
  }
  std::sort(found.begin(), found.end(), std::greater<>());
  int64_t removed = 0;
  for (size_t i = static_cast<size_t>(keep); i < found.size(); ++i) {
    const std::string failure = remove_tree(found[i].second);
    HF_CHECK(failure.empty(), "could not remove the old checkpoint ", failure);
    ++removed;
  }
  return removed;
}

std::string fine_tune_resume_checkpoint(const FineTuneOptions& o) {
  if (o.resume_mode == "disable") return "";
  if (o.resume_mode == "auto") return latest_fine_tune_checkpoint(o.out_dir);
  HF_CHECK(o.resume_mode == "resume_path", "trainer.resume_mode must be auto, disable or resume_path, got '",
           o.resume_mode, "'");
  HF_CHECK(!o.resume_from_path.empty(), "trainer.resume_mode is resume_path but trainer.resume_from_path is empty");
  HF_CHECK(checkpoint_step(normalized_dir(o.resume_from_path)) >= 0, "trainer.resume_from_path '",
           o.resume_from_path, "' is not a complete checkpoint directory (", kCheckpointPrefix,
           "<step> holding optimizer.pt)");
  return o.resume_from_path;
}

int64_t load_fine_tune_checkpoint(const std::string& dir, CausalLM& model, TrainEngine& engine) {
  const std::filesystem::path path = normalized_dir(dir);
  const int64_t step = checkpoint_step(path);
  HF_CHECK(step >= 0, "checkpoint '", dir, "' is not a complete checkpoint directory (", kCheckpointPrefix,
           "<step> holding optimizer.pt)");
  // The weights into the model the engine was built over (the engine keeps its parameters), by name; a LoRA
  // model's adapters are not among the base weights and come from its PEFT directory (fp32).
  {
    torch::NoGradGuard no_grad;
    const Pretrained saved = load_pretrained(path.string(), model->head_kind());
    std::map<std::string, torch::Tensor> from;
    for (const auto& item : saved.model->named_parameters()) from[item.key()] = item.value();
    for (const auto& item : saved.model->named_buffers()) from[item.key()] = item.value();
    if (model->has_lora()) from.merge(read_lora_adapter_tensors(path.string() + "/lora_adapter"));
    int64_t copied = 0;
    for (const auto& list : {model->named_parameters(), model->named_buffers()})
      for (const auto& item : list) {
        const auto it = from.find(item.key());
        if (it == from.end()) continue;
        HF_CHECK(it->second.sizes() == item.value().sizes(), "checkpoint '", dir, "': ", item.key(), " has shape ",
                 it->second.sizes(), ", the model's is ", item.value().sizes());
        item.value().copy_(it->second);
        ++copied;
      }
    HF_CHECK(copied == static_cast<int64_t>(from.size()), "checkpoint '", dir, "' holds ", from.size(),
             " tensors of which ", copied, " are this model's: another model's checkpoint");
  }
  engine.load_state(path.string() + kOptimizerFile);
  HF_CHECK(engine.step() == step, "checkpoint '", dir, "': its optimizer state is at step ", engine.step(),
           ", its name says ", step);
  return step;
}

FineTuneCheckpoints::FineTuneCheckpoints(const FineTuneOptions& options, CausalLM& model, const Tokenizer& tokenizer,
                                         TrainEngine& engine, const std::string& metrics_file, int64_t total_steps)
    : options_(options), model_(model), tokenizer_(tokenizer), engine_(engine), total_steps_(total_steps) {
  const std::string from = fine_tune_resume_checkpoint(options);
  if (from.empty()) {
    if (!metrics_file.empty() && file_exists(metrics_file)) write_jsonl(metrics_file, {});  // a fresh run's rows
    return;
  }
  info_.resumed_step = load_fine_tune_checkpoint(from, model, engine);
  HF_CHECK(info_.resumed_step <= total_steps, "checkpoint '", from, "' is at step ", info_.resumed_step,
           ", past this run's ", total_steps, " steps (trainer.steps)");
  info_.last_checkpoint = from;
  log_info("resumed from ", from, " (step ", info_.resumed_step, " of ", total_steps, ")");
  if (!metrics_file.empty() && file_exists(metrics_file)) {
    std::vector<nlohmann::json> kept;
    for (nlohmann::json& row : read_jsonl(metrics_file))
      if (row.value("step", int64_t{0}) <= info_.resumed_step) kept.push_back(std::move(row));
    write_jsonl(metrics_file, kept);
  }
}

bool FineTuneCheckpoints::after_step(int64_t step) {
  const bool stop = step < total_steps_ && options_.stop_requested && options_.stop_requested();
  const bool save = step == total_steps_ || stop || (options_.save_every > 0 && step % options_.save_every == 0);
  if (save && !options_.out_dir.empty()) {
    info_.last_checkpoint = save_fine_tune_checkpoint(options_.out_dir, step, model_, tokenizer_, engine_);
    if (options_.max_ckpt_to_keep > 0) remove_old_fine_tune_checkpoints(options_.out_dir, options_.max_ckpt_to_keep);
  }
  info_.stopped = stop;
  return stop;
}

}  // namespace hybridflow
