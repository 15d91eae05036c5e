#!/usr/bin/env bash
# The TRL peer: hybridflow's GRPO against TRL's GRPOTrainer on the same model, prompts, reward, group size,
# lengths, steps, threads and dtype (bench/grpo_vs_trl.py lists what is matched and what is not). Not part of
# CI: it installs TRL into .venv (scripts/setup.sh --bench) and builds the hybridflow binary first.
#   bash bench/grpo_vs_trl.sh [--steps 6 --prompts 8 --group 8 --response-length 32 --threads N ...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --bench
bash scripts/build.sh hybridflow
export OMP_WAIT_POLICY=passive
exec .venv/bin/python bench/grpo_vs_trl.py --hybridflow "${HF_BUILD_DIR:-build}/hybridflow" "$@"
