// The keys every fine-tuning command's schema (sft, rm, dpo; apps/*_config.h) has, with the same defaults: each
// is written once here and spliced into the three (indented for the section it goes under).
#pragma once

namespace hybridflow::cli {

// Under model: LoRA (docs/lora.md).
inline constexpr const char* kFineTuneLoraKeys = R"YAML(  lora_rank: 0           # LoRA adapters of this rank (docs/lora.md); 0 = train every weight
  lora_alpha: 16.0
  target_modules: null   # null = all-linear; or PEFT module names; a string is a regular expression
  exclude_modules: null
  lora_adapter_path: null  # a PEFT adapter directory to start from
)YAML";

// Under trainer: checkpoints and resuming.
inline constexpr const char* kFineTuneCheckpointKeys = R"YAML(  save_every: 0          # steps between checkpoints in out_dir/checkpoint-STEP (0 = only the last step's); Ctrl-C saves the step it stops at
  max_ckpt_to_keep: 0    # keep the newest K checkpoints of out_dir; 0 = all
  resume_mode: auto      # auto (the newest complete checkpoint of out_dir, if any) | disable | resume_path
  resume_from_path: ""   # with resume_mode: resume_path: a checkpoint-STEP directory
)YAML";

// Under trainer, after out_dir: the run's seed, threads and device.
inline constexpr const char* kFineTuneRunKeys = R"YAML(  seed: 0
  threads: 0             # 0 = one per core
  device: auto           # cpu | cuda | auto (cuda when a GPU is visible)
)YAML";

}  // namespace hybridflow::cli
