// The `hybridflow dpo` configuration schema: every key with its default. Documented in
// docs/configuration.md (section dpo).
#pragma once

#include <string>

#include "fine_tune_schema.h"

namespace hybridflow::cli {

inline const std::string kDpoDefaultsYaml = std::string(R"YAML(
model:
  path: ???              # the policy's starting model directory (an SFT model, usually)
  ref_path: ""           # the frozen reference; empty = the starting model (with LoRA: the policy, adapters off)
)YAML") + kFineTuneLoraKeys + R"YAML(data:
  task: addition         # built-in task: makes pairs (chosen = answer, rejected = corrupted answer) when train_file is empty, and scores held-out answers
  train_file: ""         # preference pairs in TRL's formats, JSONL or parquet (docs/configuration.md); empty = generate from the task
  test_file: ""          # held-out pairs: greedy answers scored against "chosen", and the implicit reward's pairwise accuracy
  train_size: 2000       # generated training prompts (when train_file is empty)
  test_size: 200
  pairs_per_prompt: 2    # corruptions per training prompt (generated data)
  seed: 0
  min_digits: 1          # task options (addition: operand digits)
  max_digits: 3
  min_length: 2          # task options (reverse / sort: string length)
  max_length: 2
  add_bos: true          # plain prompts: encoded with bos, as the RL trainer's data.add_bos
  apply_chat_template: false  # plain-string prompts as a user message through model.path's chat template
dpo:
  beta: 0.1              # the implicit reward's scale: beta (log pi - log ref); simpo / orpo: beta x mean token log-prob
  loss_type: sigmoid     # sigmoid (DPO) | ipo | simpo | orpo (simpo and orpo: no reference model)
  label_smoothing: 0.0   # sigmoid, simpo: the assumed share of flipped preferences (cDPO), in [0, 0.5)
  simpo_gamma: 0.5       # simpo: the target reward margin gamma
optim:
  lr: 1.0e-4
  weight_decay: 0.0
  betas: [0.9, 0.999]   # AdamW\'s
  eps: 1.0e-8
  warmup_steps: 10
  schedule: constant     # constant | linear | cosine
  min_lr_ratio: 0.1
  grad_clip: 1.0
trainer:
  steps: 200             # optimizer steps (0 = one pass per epoch)
  epochs: 1
  batch_size: 32         # pairs per step
  micro_batch_size: 32
  eval_every: 50
  eval_samples: 200
)YAML" + kFineTuneCheckpointKeys + R"YAML(  out_dir: runs/dpo      # final model in out_dir/final, metrics in out_dir/dpo_metrics.jsonl
)YAML" + kFineTuneRunKeys + R"YAML(  max_new_tokens: 8      # held-out greedy answers
)YAML";

}  // namespace hybridflow::cli
