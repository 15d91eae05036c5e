// What the fine-tuning loops (SFT, reward model) share: the data files, the optimizer and its schedule,
// the step budget, the evaluation cadence and the data order. Each loop's options add their own.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "hybridflow/engine/train_engine.h"

namespace hybridflow {

struct FineTuneOptions {
  std::string train_file;  // JSONL rows; the format is the loop's
  std::string eval_file;   // JSONL held-out rows; empty = no evaluation
  double lr = 1e-3;
  double weight_decay = 0.01;
  double beta1 = 0.9;  // AdamW's
  double beta2 = 0.999;
  double eps = 1e-8;
  int64_t batch_size = 32;        // rows per optimizer step
  int64_t micro_batch_size = 32;  // rows per forward/backward
  int64_t steps = 0;              // optimizer steps; 0 = `epochs` passes over the data
  int64_t epochs = 1;
  int64_t warmup_steps = 0;
  std::string schedule = "cosine";  // constant | linear | cosine
  double min_lr_ratio = 0.1;
  double grad_clip = 1.0;
  int64_t eval_every = 0;      // steps between evaluations (0 = only at the end, when eval_file is set)
  int64_t eval_samples = 200;  // held-out rows scored per evaluation (the file's first ones)
  std::string out_dir;         // where the loop writes its metrics (and checkpoints); empty = nowhere
  uint64_t seed = 0;           // data order
  // Checkpoints (finetune/fine_tune_checkpoint.h), with out_dir: every save_every steps (0: none between) and at
  // the last step; a stop asked by stop_requested (checked after every step; a Ctrl-C) saves the step it ends.
  int64_t save_every = 0;
  int64_t max_ckpt_to_keep = 0;  // after each save, all but the newest K checkpoints of out_dir go; 0 = keep all
  std::function<bool()> stop_requested{};
  // Where a run starts (verl's trainer.resume_mode): "auto" continues from the newest complete checkpoint of
  // out_dir when there is one, "resume_path" from resume_from_path, "disable" starts fresh.
  std::string resume_mode = "auto";
  std::string resume_from_path;
};

// What every fine-tuning loop's result says besides its own metrics.
struct FineTuneRunInfo {
  int64_t resumed_step = 0;     // the checkpoint's step the run continued from (0: a fresh start)
  bool stopped = false;         // stop_requested ended it before its last step
  std::string last_checkpoint;  // the newest checkpoint it wrote (empty: none)
};

// `steps`, or `epochs` (at least 1) passes over `rows` rows in batches of batch_size.
int64_t fine_tune_total_steps(const FineTuneOptions& o, int64_t rows);

// The optimizer and its learning-rate schedule over `total_steps`.
OptimizerOptions fine_tune_optimizer(const FineTuneOptions& o, int64_t total_steps);

}  // namespace hybridflow
