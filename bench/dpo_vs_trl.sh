#!/usr/bin/env bash
# The TRL peer for DPO: `hybridflow dpo` against TRL's DPOTrainer (CPOTrainer / ORPOTrainer with --loss simpo /
# orpo) on the same model, pairs, loss, batch, steps, threads and dtype (bench/dpo_vs_trl.py lists what is matched
# and what is not). Not part of CI: it installs
# TRL into .venv (scripts/setup.sh --bench) and builds the hybridflow binary first.
#   bash bench/dpo_vs_trl.sh [--loss sigmoid|simpo|orpo --steps 12 --batch 32 --threads N --repeat 2 ...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --bench
bash scripts/build.sh hybridflow
export OMP_WAIT_POLICY=passive
exec .venv/bin/python bench/dpo_vs_trl.py --hybridflow "${HF_BUILD_DIR:-build}/hybridflow" "$@"
