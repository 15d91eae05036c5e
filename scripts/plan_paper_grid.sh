#!/usr/bin/env bash
# `hybridflow plan` over the HybridFlow paper's PPO setting (A100-80GB nodes of 8, Llama 7B to 70B, prompts and
# responses of 1024 tokens, 1024 prompts a batch) for 16 to 128 GPUs: prints the markdown table of
# docs/placement.md (placement, pools with each role's p/t/d, iteration time, tokens/s, the best colocated
# plan's time, search seconds).
# Usage: bash scripts/plan_paper_grid.sh [extra plan flags, e.g. --mini-batches 4 --staleness 1]
set -euo pipefail
cd "$(dirname "$0")/.."
hf=${HF_BUILD_DIR:-build}/hybridflow
[ -x "$hf" ] || bash scripts/build.sh hybridflow
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
row=$(mktemp)
trap 'rm -f "$row"' EXIT
cat > "$row" <<'PY'
import json, sys
j = json.load(sys.stdin)
model, gpus = sys.argv[1], sys.argv[2]
search = "%.2f" % j["search"]["seconds"]
if not j["found"]:
    print("| %s | %s | nothing fits | | | | | %s |" % (model, gpus, search))
    sys.exit()
b = j["best"]
def pools(p):
    return "<br>".join("%d: %s" % (s["devices"], ", ".join("%s %d/%d/%d" % (r["role"], r["pp"], r["tp"], r["dp"])
                                                          for r in s["roles"])) for s in p["sets"])
colocate = [p for p in [b] + j["runners_up"] if p["placement"] == "colocate"]
col = "%.1f" % colocate[0]["iteration_s"] if colocate else "does not fit"
print("| %s | %s | %s | %s | %.1f | %.0f | %s | %s |" % (model, gpus, b["placement"], pools(b), b["iteration_s"],
                                                     b["tokens_per_s"], col, search))
PY
echo "| model | GPUs | placement | pools (devices: role p/t/d) | iteration s | tokens/s | colocate s | search s |"
echo "|---|---|---|---|---|---|---|---|"
for model in llama-7b llama-13b llama-34b llama-70b; do
  for gpus in 16 32 64 96 128; do
    "$hf" plan --gpus "$gpus" --gpus-per-node 8 --gpu a100-80g --model "$model" --algorithm ppo \
        --prompt-length 1024 --response-length 1024 --batch 1024 --runners-up 60 --json "$@" |
      "$py" "$row" "$model" "$gpus"
  done
done
