// The `hybridflow rm` configuration schema: every key with its default. Documented in
// docs/configuration.md (section rm).
#pragma once

namespace hybridflow::cli {

inline constexpr const char* kRmDefaultsYaml = R"YAML(
model:
  path: ""               # model directory to start from (LM or value head); empty = a fresh preset
  preset: tiny           # used when path is empty, with the tokenizer alphabet of data.task
  hidden_size: 0         # preset overrides (0 = the preset's)
  num_hidden_layers: 0
  intermediate_size: 0
  init_seed: 0
  lora_rank: 0           # LoRA adapters of this rank (docs/lora.md); 0 = train every weight
  lora_alpha: 16.0
  target_modules: null   # null = all-linear; or PEFT module names
  exclude_modules: null
  lora_adapter_path: null  # a PEFT adapter directory to start from
data:
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
  save_every: 0          # steps between checkpoints in out_dir/checkpoint-STEP (0 = only the last step's); Ctrl-C saves the step it stops at
  max_ckpt_to_keep: 0    # keep the newest K checkpoints of out_dir; 0 = all
  resume_mode: auto      # auto (the newest complete checkpoint of out_dir, if any) | disable | resume_path
  resume_from_path: ""   # with resume_mode: resume_path: a checkpoint-STEP directory
  out_dir: runs/rm       # final model in out_dir/final, metrics in out_dir/rm_metrics.jsonl
  seed: 0
  threads: 0             # 0 = one per core
  device: auto           # cpu | cuda | auto (cuda when a GPU is visible)
)YAML";

}  // namespace hybridflow::cli
