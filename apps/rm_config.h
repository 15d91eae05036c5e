// The `hybridflow rm` configuration schema: every key with its default. Documented in
// docs/configuration.md (section rm).
#pragma once

#include <string>

#include "fine_tune_schema.h"

namespace hybridflow::cli {

inline const std::string kRmDefaultsYaml = std::string(R"YAML(
model:
  path: ""               # model directory to start from (LM or value head); empty = a fresh preset
  preset: tiny           # used when path is empty, with the tokenizer alphabet of data.task
  hidden_size: 0         # preset overrides (0 = the preset's)
  num_hidden_layers: 0
  intermediate_size: 0
  init_seed: 0
)YAML") + kFineTuneLoraKeys + R"YAML(data:
  task: reverse          # built-in task: makes pairs (chosen = answer, rejected = corrupted answer) when train_file is empty
  train_file: ""         # preference pairs in TRL's formats, JSONL or parquet (docs/configuration.md); empty = generate from the task
  test_file: ""          # held-out pairs for pairwise accuracy
  train_size: 476        # generated training prompts (when train_file is empty); reverse of 2 letters has 676
  test_size: 200
  pairs_per_prompt: 8    # corruptions per training prompt (generated data)
  seed: 0
  min_digits: 1          # task options (addition: operand digits)
  max_digits: 3
  min_length: 2          # task options (reverse / sort: string length)
  max_length: 2
  add_bos: true          # must match the RL run's data.add_bos
  apply_chat_template: false  # plain-string prompts as a user message through model.path's chat template (chat prompts always go through it)
optim:
  lr: 0.002
  weight_decay: 0.01
  betas: [0.9, 0.999]   # AdamW\'s
  eps: 1.0e-8
  warmup_steps: 10
  schedule: cosine       # constant | linear | cosine
  min_lr_ratio: 0.1
  grad_clip: 1.0
trainer:
  steps: 300             # optimizer steps (0 = one pass per epoch)
  epochs: 1
  batch_size: 32         # pairs per step
  micro_batch_size: 32
  eval_every: 100
  eval_samples: 200
)YAML" + kFineTuneCheckpointKeys + R"YAML(  out_dir: runs/rm       # final model in out_dir/final, metrics in out_dir/rm_metrics.jsonl
)YAML" + kFineTuneRunKeys;

}  // namespace hybridflow::cli
