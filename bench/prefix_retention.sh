#!/usr/bin/env bash
# Prefix caching with and without freed blocks' prefixes retained (HF_PREFIX_RETENTION), and with prefix caching
# off, in the same run: a rollout whose prompts all begin with the same system prompt and whose KV pool holds one
# prompt's samples at a time (--max-num-seqs = --samples), so each prompt starts only after the one before has
# ended and freed its blocks. Without retention nothing holding the system prompt is running when the next prompt
# arrives; with it the freed blocks still hold it. Not part of CI; builds the hybridflow binary first.
#   bash bench/prefix_retention.sh [--preset qwen3-0.6b] [--prompts 8] [--shared 480]   (other flags go to bench)
set -euo pipefail
cd "$(dirname "$0")/.."
preset=qwen3-0.6b
prompts=8
shared=480
samples=4
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --preset) preset="$2"; shift 2 ;;
    --prompts) prompts="$2"; shift 2 ;;
    --shared) shared="$2"; shift 2 ;;
    *) extra+=("$1"); shift ;;
  esac
done
bash scripts/build.sh hybridflow >/dev/null
export OMP_WAIT_POLICY=passive
bin="$PWD/${HF_BUILD_DIR:-build}/hybridflow"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
run() {  # $1: on | off (HF_PREFIX_RETENTION)
  HF_PREFIX_RETENTION=$1 "$bin" bench generate --preset "$preset" --threads 2 --rollout-only --no-static-baseline \
    --reps 1 --rollout-prompts "$prompts" --samples $samples --max-num-seqs $samples --admission-rows 0 \
    --prompt-length 32 --response-length 16 --stop-every 8 --shared-prefix "$shared" --json "${extra[@]}" |
    sed "s/^/$1 /" >>"$out"
}
run off
run on
python3 - "$out" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    retention, text = line.split(" ", 1)
    m = json.loads(text)
    rows[(retention, m["what"])] = m
def get(retention, what):
    m = rows[(retention, what)]
    e = m.get("extra", m)
    return e["seconds"], e.get("prefix_cached_tokens", 0), e.get("kv_peak_blocks", 0)
uncached = [get(r, "rollout prefix caching off")[0] for r in ("off", "on")]
print("| rollout | seconds | positions found | peak KV blocks | x caching off |")
print("|---|---|---|---|---|")
base = min(uncached)
s, f, b = get("off", "rollout prefix caching off")
print(f"| prefix caching off (the faster of its two runs: {uncached[0]:.1f} / {uncached[1]:.1f} s) | {base:.1f} | 0 | {b} | 1.00 |")
for retention in ("off", "on"):
    s, f, b = get(retention, "rollout")
    print(f"| prefix caching on, HF_PREFIX_RETENTION={retention} | {s:.1f} | {f} | {b} | {base / s:.2f} |")
PY
