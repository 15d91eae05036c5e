// Checkpoints of the fine-tuning loops (`hybridflow sft`, `rm`, `dpo`) and their resumption, so that a run that
// stops (a crash, a preempted job, Ctrl-C) continues where its last checkpoint left it, bit for bit:
//   <out_dir>/checkpoint-<step>/              the model as a Hugging Face directory (with LoRA: the base model and
//                                             lora_adapter/ in PEFT's format, fp32)
//   <out_dir>/checkpoint-<step>/optimizer.pt  AdamW's moments, the step count (the LR schedule's position) and, in
//                                             mixed precision, the fp32 master weights
// A checkpoint is written whole under a temporary name and renamed, so a crash while saving leaves the previous
// one in charge. The data order is a function of the seed and the step, and the loops draw no random numbers
// while training, so nothing else needs saving; the metrics file keeps the rows of the steps the checkpoint
// holds.
#pragma once

#include <cstdint>
#include <string>

#include "hybridflow/engine/train_engine.h"
#include "hybridflow/finetune/fine_tune_options.h"
#include "hybridflow/model/tokenizer.h"
#include "hybridflow/model/transformer.h"

namespace hybridflow {

// "<out_dir>/checkpoint-<step>".
std::string checkpoint_dir(const std::string& out_dir, int64_t step);

// Writes checkpoint_dir(out_dir, step) atomically; returns it.
std::string save_fine_tune_checkpoint(const std::string& out_dir, int64_t step, const CausalLM& model,
                                      const Tokenizer& tokenizer, const TrainEngine& engine);

// The run's final model directory `final_dir` (what save_pretrained writes), atomically. When `checkpoint` is a
// checkpoint of these same weights (the one written after the last step; "" for none) its model files are
// hard-linked instead of written again, so that the weights are on disk once (at 8 B parameters in fp32, 32 GB
// less); on a filesystem that refuses links they are written. Returns how many files were linked.
int64_t save_final_model(const std::string& final_dir, const std::string& checkpoint, const CausalLM& model,
                         const Tokenizer& tokenizer);

// The complete checkpoint of out_dir with the highest step ("" when none).
std::string latest_fine_tune_checkpoint(const std::string& out_dir);

// Removes all but the newest `keep` complete checkpoints of out_dir (keep >= 1); returns how many went.
int64_t remove_old_fine_tune_checkpoints(const std::string& out_dir, int64_t keep);

// The checkpoint options say to start from: "" for a fresh start. Errors name trainer.resume_mode or
// trainer.resume_from_path.
std::string fine_tune_resume_checkpoint(const FineTuneOptions& options);

// Loads a checkpoint's weights (and LoRA adapters) into the model and its optimizer state into the engine built
// over it; returns the checkpoint's step. Errors name the checkpoint and what does not match.
int64_t load_fine_tune_checkpoint(const std::string& dir, CausalLM& model, TrainEngine& engine);

// One loop's checkpointing: resumes (when options say so) as it is made, after the engine, and saves after
// the steps that options say.
class FineTuneCheckpoints {
 public:
  // metrics_file: the loop's JSONL metrics ("" for none); on a resume it keeps the rows up to the checkpoint's
  // step. Throws when the checkpoint's step is past total_steps.
  FineTuneCheckpoints(const FineTuneOptions& options, CausalLM& model, const Tokenizer& tokenizer,
                      TrainEngine& engine, const std::string& metrics_file, int64_t total_steps);
  int64_t resumed_step() const { return info_.resumed_step; }
  // After step `step` has run (and been evaluated): saves a checkpoint when save_every or the last step says so,
  // or when a stop was asked; true when the loop ends here because of that stop.
  bool after_step(int64_t step);
  const FineTuneRunInfo& info() const { return info_; }

 private:
  const FineTuneOptions& options_;
  const CausalLM& model_;
  const Tokenizer& tokenizer_;
  const TrainEngine& engine_;
  int64_t total_steps_;
  FineTuneRunInfo info_;
};

}  // namespace hybridflow
