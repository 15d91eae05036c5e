#!/usr/bin/env bash
# The python + MCP tools example end to end on a CPU (docs/agentic.md): data and the calculator example's
# character tokenizer, a tiny model over it, SFT on demonstrations of both tools, then GRPO with multi-turn
# rollouts that run code in the python sandbox and ask the MCP server. Needs `bwrap` and the repository's
# .venv (its Python has `mcp`; scripts/setup.sh makes it).
#   HF_BUILD_DIR   where the hybridflow binary is (default: build)
# Extra arguments are overrides for the GRPO stage (e.g. trainer.total_steps=60).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_WAIT_POLICY=passive
hf=${HF_BUILD_DIR:-build}/hybridflow
run=runs/python_mcp
rm -rf "$run"

echo "== 1. questions, demonstrations and the tokenizer"
python3 examples/python_mcp_tools/make_data.py "$run"

echo "== 2. a tiny model over the tokenizer"
"$hf" init --tokenizer "$run/tokenizer" --preset tiny --seed 0 --out "$run/init"

echo "== 3. SFT on demonstrations of both tools"
"$hf" sft --config examples/sft_python_mcp_tools.yaml

echo "== 4. GRPO with the python sandbox and the MCP server"
"$hf" train --config examples/grpo_python_mcp_tools.yaml "$@"
