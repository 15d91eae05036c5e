// The `hybridflow sft` configuration schema: every key with its default. Documented in
// docs/configuration.md; `???` marks a required key.
#pragma once

namespace hybridflow::cli {

inline constexpr const char* kSftDefaultsYaml = R"YAML(
model:
  path: ???              # model directory to start from (hybridflow init writes one)
  lora_rank: 0           # LoRA adapters of this rank (docs/lora.md); 0 = train every weight
  lora_alpha: 16.0
  target_modules: null   # null = all-linear; or PEFT module names
  exclude_modules: null
  lora_adapter_path: null  # a PEFT adapter directory to start from
data:
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
  save_every: 0          # steps between checkpoints in out_dir/checkpoint-STEP (0 = only the last step's); Ctrl-C saves the step it stops at
  max_ckpt_to_keep: 0    # keep the newest K checkpoints of out_dir; 0 = all
  resume_mode: auto      # auto (the newest complete checkpoint of out_dir, if any) | disable | resume_path
  resume_from_path: ""   # with resume_mode: resume_path: a checkpoint-STEP directory
  out_dir: runs/sft
  seed: 0
  threads: 0             # 0 = one per core
  device: auto           # cpu | cuda | auto (cuda when a GPU is visible)
  max_new_tokens: 8
)YAML";

}  // namespace hybridflow::cli
