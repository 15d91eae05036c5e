#include "hybridflow/finetune/fine_tune_options.h"

#include <algorithm>

namespace hybridflow {

int64_t fine_tune_total_steps(const FineTuneOptions& o, int64_t rows) {
  return o.steps > 0 ? o.steps : std::max<int64_t>(1, o.epochs) * ((rows + o.batch_size - 1) / o.batch_size);
}

OptimizerOptions fine_tune_optimizer(const FineTuneOptions& o, int64_t total_steps) {
  OptimizerOptions opt;
  opt.schedule.lr = o.lr;
  opt.schedule.kind = o.schedule;
  opt.schedule.warmup_steps = o.warmup_steps;
  opt.schedule.total_steps = total_steps;
  opt.schedule.min_lr_ratio = o.min_lr_ratio;
  opt.weight_decay = o.weight_decay;
  opt.beta1 = o.beta1;
  opt.beta2 = o.beta2;
  opt.eps = o.eps;
  opt.grad_clip = o.grad_clip;
  return opt;
}

}  // namespace hybridflow
