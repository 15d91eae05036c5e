#!/usr/bin/env bash
# `hybridflow plan` over the HybridFlow paper's PPO setting (A100-80GB nodes of 8, Llama 7B to 70B, prompts and
# responses of 1024 tokens, 1024 prompts a batch) for 16 to 128 GPUs: prints the markdown table of
# docs/placement.md (placement, pools, iteration time, tokens/s, search seconds) and the slowest search.
# Usage: bash scripts/plan_paper_grid.sh [extra plan flags, e.g. --staleness 1]
set -euo pipefail
cd "$(dirname "$0")/.."
hf=${HF_BUILD_DIR:-build}/hybridflow
[ -x "$hf" ] || bash scripts/build.sh hybridflow
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
echo "| model | GPUs | placement | pools (devices) and layouts | iteration s | tokens/s | colocate s | search s |"
echo "|---|---|---|---|---|---|---|---|"
for model in llama-7b llama-13b llama-34b llama-70b; do
  for gpus in 16 32 64 96 128; do
    "$hf" plan --gpus "$gpus" --gpus-per-node 8 --gpu a100-80g --model "$model" --algorithm ppo \
        --prompt-length 1024 --response-length 1024 --batch 1024 --runners-up 60 --json "$@" |
      "$py" -c '
import json, sys
j = json.load(sys.stdin)
model, gpus = sys.argv[1], sys.argv[2]
if not j["found"]:
    print(f"| {model} | {gpus} | none fits | | | | | {j[\"search\"][\"seconds\"]:.2f} |")
    sys.exit()
b = j["best"]
def pools(p):
    out = []
    for s in p["sets"]:
        roles = ", ".join(f"{r[\"role\"]} {r[\"pp\"]}/{r[\"tp\"]}/{r[\"dp\"]}" for r in s["roles"])
        out.append(f"{s[\"devices\"]}: {roles}")
    return "<br>".join(out)
colocate = [p for p in [b] + j["runners_up"] if p["placement"] == "colocate"]
col = f"{colocate[0][\"iteration_s\"]:.1f}" if colocate else "does not fit"
print(f"| {model} | {gpus} | {b[\"placement\"]} | {pools(b)} | {b[\"iteration_s\"]:.1f} | {b[\"tokens_per_s\"]:.0f} | {col} | {j[\"search\"][\"seconds\"]:.2f} |")
' "$model" "$gpus"
  done
done
