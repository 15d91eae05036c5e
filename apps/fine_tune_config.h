// The keys `hybridflow sft` and `hybridflow rm` read the same way (optim.*, the trainer's step budget,
// batch sizes, evaluation cadence and seed), so both commands mean the same by them.
#pragma once

#include <cstdint>
#include <string>

#include "hybridflow/core/config.h"
#include "hybridflow/finetune/fine_tune_options.h"

namespace hybridflow::cli {

inline void read_fine_tune_options(const Config& cfg, FineTuneOptions& opts) {
  opts.lr = cfg.get<double>("optim.lr");
  opts.weight_decay = cfg.get<double>("optim.weight_decay");
  opts.warmup_steps = cfg.get<int64_t>("optim.warmup_steps");
  opts.schedule = cfg.get<std::string>("optim.schedule");
  opts.min_lr_ratio = cfg.get<double>("optim.min_lr_ratio");
  opts.grad_clip = cfg.get<double>("optim.grad_clip");
  opts.steps = cfg.get<int64_t>("trainer.steps");
  opts.epochs = cfg.get<int64_t>("trainer.epochs");
  opts.batch_size = cfg.get<int64_t>("trainer.batch_size");
  opts.micro_batch_size = cfg.get<int64_t>("trainer.micro_batch_size");
  opts.eval_every = cfg.get<int64_t>("trainer.eval_every");
  opts.eval_samples = cfg.get<int64_t>("trainer.eval_samples");
  opts.seed = static_cast<uint64_t>(cfg.get<int64_t>("trainer.seed"));
}

}  // namespace hybridflow::cli
