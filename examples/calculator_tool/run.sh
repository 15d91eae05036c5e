#!/usr/bin/env bash
# The calculator-tool example end to end on a laptop CPU (docs/agentic.md has its curve): data and a
# character tokenizer with a chat template, a tiny model over it, SFT on tool-use demonstrations, then GRPO
# with multi-turn rollouts that call the calculator. A second SFT on direct answers (no tool) is the baseline.
#   HF_BUILD_DIR   where the hybridflow binary is (default: build)
# Extra arguments are overrides for the GRPO stage (e.g. trainer.total_steps=100).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_WAIT_POLICY=passive
hf=${HF_BUILD_DIR:-build}/hybridflow
run=runs/calculator
rm -rf "$run"

echo "== 1. questions, demonstrations and the tokenizer"
python3 examples/calculator_tool/make_data.py "$run"

echo "== 2. a tiny model over the tokenizer"
"$hf" init --tokenizer "$run/tokenizer" --preset tiny --seed 0 --out "$run/init"

echo "== 3. SFT on tool-use demonstrations"
"$hf" sft --config examples/sft_calculator_tool.yaml

echo "== 4. the baseline without tools: SFT on direct answers, scored on the held-out questions"
"$hf" sft --config examples/sft_calculator_tool.yaml data.train_file="$run/sft_direct.jsonl" \
    data.test_file="$run/test_no_tools.jsonl" trainer.out_dir="$run/sft_direct" trainer.max_new_tokens=8

echo "== 5. GRPO with the calculator"
"$hf" train --config examples/grpo_calculator_tool.yaml "$@"
