// The `hybridflow dpo` configuration schema: every key with its default. Documented in
// docs/configuration.md (section dpo).
#pragma once

namespace hybridflow::cli {

inline constexpr const char* kDpoDefaultsYaml = R"YAML(
model:
  path: ???              # the policy's starting model directory (an SFT model, usually)
  ref_path: ""           # the frozen reference; empty = the starting model (with LoRA: the policy, adapters off)
  lora_rank: 0           # LoRA adapters of this rank (docs/lora.md); 0 = train every weight
  lora_alpha: 16.0
  target_modules: null   # null = all-linear; or PEFT module names
  exclude_modules: null
  lora_adapter_path: null  # a PEFT adapter directory to start from
data:
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
  save_every: 0          # steps between checkpoints in out_dir/checkpoint-STEP (0 = only the last step's); Ctrl-C saves the step it stops at
  max_ckpt_to_keep: 0    # keep the newest K checkpoints of out_dir; 0 = all
  resume_mode: auto      # auto (the newest complete checkpoint of out_dir, if any) | disable | resume_path
  resume_from_path: ""   # with resume_mode: resume_path: a checkpoint-STEP directory
  out_dir: runs/dpo      # final model in out_dir/final, metrics in out_dir/dpo_metrics.jsonl
  seed: 0
  threads: 0             # 0 = one per core
  device: auto           # cpu | cuda | auto (cuda when a GPU is visible)
  max_new_tokens: 8      # held-out greedy answers
)YAML";

}  // namespace hybridflow::cli
