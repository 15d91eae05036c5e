#!/usr/bin/env bash
# GRPO on a mixture-of-experts model with expert parallelism, end to end on a laptop CPU (docs/models.md has
# its figures): a tiny Qwen3-MoE model (the qwen3-moe-tiny preset: 4 layers, hidden 128, 2 sparse layers of 8
# experts, top 2), a short SFT on addition that leaves it imperfect, then GRPO with the experts split over 2
# processes (expert_model_parallel_size 2) while the held-out exact match (val/score) rises.
#   HF_BUILD_DIR   where the hybridflow binary is (default: build)
# Extra arguments are overrides for the GRPO stage (e.g. trainer.total_steps=200).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_WAIT_POLICY=passive
hf=${HF_BUILD_DIR:-build}/hybridflow
run=${HF_RUN_DIR:-runs/moe_ep2}
rm -rf "$run"

echo "== 1. a tiny Qwen3-MoE model"
"$hf" init --preset qwen3-moe-tiny --task addition --seed 0 --out "$run/init"

echo "== 2. a short SFT on addition (held-out exact match printed every 50 steps)"
"$hf" sft --config examples/sft_addition.yaml model.path="$run/init" trainer.out_dir="$run/sft" \
    trainer.steps=250 trainer.eval_every=50

echo "== 3. GRPO with expert parallelism 2; held-out score every 25 steps"
"$hf" train --config examples/grpo_moe_ep2_addition.yaml model.path="$run/sft/final" trainer.run_dir="$run/grpo" \
    data.train_file="$run/sft/data/train.jsonl" data.test_file="$run/sft/data/test.jsonl" \
    trainer.total_steps=150 trainer.test_freq=25 actor_rollout_ref.actor.optim.lr=2.0e-4 "$@"
