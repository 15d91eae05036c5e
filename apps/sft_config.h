// The `hybridflow sft` configuration schema: every key with its default. Documented in
// docs/configuration.md; `???` marks a required key.
#pragma once

#include <string>

#include "fine_tune_schema.h"

namespace hybridflow::cli {

inline const std::string kSftDefaultsYaml = std::string(R"YAML(
model:
  path: ???              # model directory to start from (hybridflow init writes one)
)YAML") + kFineTuneLoraKeys + R"YAML(data:
  task: addition         # built-in task: scores evaluation answers; generates data when train_file is empty
  train_file: ""         # {"prompt", "response"} rows or verl's (parquet / JSONL; docs/data.md); empty = from the task
  test_file: ""          # held-out rows {"prompt", "answer"} or verl's
  apply_chat_template: false  # plain-string prompts as a user message through the chat template (messages always)
  train_size: 20000      # generated examples (when train_file is empty)
  test_size: 200
  seed: 0
  min_digits: 1          # task options (addition: operand digits; sort: length)
  max_digits: 3
optim:
  lr: 0.001
  weight_decay: 0.01
  betas: [0.9, 0.999]   # AdamW\'s
  eps: 1.0e-8
  warmup_steps: 20
  schedule: cosine       # constant | linear | cosine
  min_lr_ratio: 0.1
  grad_clip: 1.0
trainer:
  steps: 600             # optimizer steps (0 = one pass per epoch)
  epochs: 1
  batch_size: 64
  micro_batch_size: 64
  eval_every: 100
  eval_samples: 200
)YAML" + kFineTuneCheckpointKeys + R"YAML(  out_dir: runs/sft
)YAML" + kFineTuneRunKeys + R"YAML(  max_new_tokens: 8
)YAML";

}  // namespace hybridflow::cli
