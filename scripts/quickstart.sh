#!/usr/bin/env bash
# The main job: installs, builds, then on this machine creates a tiny Llama-style model, fine-tunes it
# on 1-2 digit addition (held-out exact-match accuracy is printed as it rises), improves it further
# with PPO against the task's exact-match reward, and samples from the result.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh hybridflow   # only what the main job runs: no tests, benchmarks or examples
export OMP_WAIT_POLICY=passive
hf=${HF_BUILD_DIR:-build}/hybridflow
run=${HF_RUN_DIR:-runs/quickstart}
rm -rf "$run"

echo "== 1. create a tiny model"
"$hf" init --preset tiny --task addition --seed 0 --out "$run/init"
"$hf" info "$run/init"

echo "== 2. supervised fine-tuning on addition"
"$hf" sft --config examples/sft_addition.yaml model.path="$run/init" trainer.out_dir="$run/sft" "$@"

echo "== 3. RL: PPO (GAE + critic) with the task's exact-match reward; held-out score every 50 steps"
"$hf" train --config examples/ppo_addition.yaml model.path="$run/sft/final" trainer.run_dir="$run/ppo" \
    data.train_file="$run/sft/data/train.jsonl" data.test_file="$run/sft/data/test.jsonl"

echo "== 4. sample from the RL-trained model (held-out prompts)"
"$hf" generate "$run/ppo/checkpoints/$(cat "$run/ppo/checkpoints/latest")/actor" --prompts-file "$run/sft/data/test.jsonl" --task addition --limit 10 --greedy
