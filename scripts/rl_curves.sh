#!/usr/bin/env bash
# Runs every RL example config (PPO, GRPO, RLOO, ReMax, REINFORCE++, Safe-RLHF, Dr. GRPO, DAPO, GSPO) from the main job's
# fine-tuned model and prints each one's held-out curve: greedy exact match on the 200 held-out
# problems every 50 steps, plus the training reward. About 2 minutes per algorithm on 2 cores.
# Needs the SFT model of scripts/quickstart.sh (runs it first when missing).
# Usage: bash scripts/rl_curves.sh [ppo grpo ...] (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
export OMP_WAIT_POLICY=passive
hf=${HF_BUILD_DIR:-build}/hybridflow
run=${HF_RUN_DIR:-runs/quickstart}
out=${HF_CURVES_DIR:-runs/curves}
[ -f "$run/sft/final/config.json" ] || bash scripts/quickstart.sh

algorithms=("$@")
[ ${#algorithms[@]} -gt 0 ] || algorithms=(ppo grpo rloo remax reinforce_pp safe_rlhf dr_grpo dapo gspo)
for a in "${algorithms[@]}"; do
  echo "== $a (examples/${a}_addition.yaml)"
  rm -rf "${out:?}/$a"
  "$hf" train --config "examples/${a}_addition.yaml" model.path="$run/sft/final" trainer.run_dir="$out/$a" \
      data.train_file="$run/sft/data/train.jsonl" data.test_file="$run/sft/data/test.jsonl" \
      trainer.test_freq=50 trainer.log_every=50 trainer.save_checkpoint=false 2>&1 | grep -E "held-out|^step"
done

echo
echo "== held-out greedy exact match (200 problems) / mean training reward of the last 50 steps"
python3 - "$out" "${algorithms[@]}" <<'EOF'
import json, sys
out, algorithms = sys.argv[1], sys.argv[2:]
rows = {a: [json.loads(l) for l in open(f"{out}/{a}/metrics.jsonl")] for a in algorithms}
steps = sorted({r["step"] for a in algorithms for r in rows[a] if "val/score" in r})
print(f"{'algorithm':<14}" + "".join(f"{'step ' + str(s):>16}" for s in steps))
for a in algorithms:
    val = {r["step"]: r["val/score"] for r in rows[a] if "val/score" in r}
    cells = []
    for s in steps:
        window = [r["score/mean"] for r in rows[a] if s - 50 < r["step"] <= s]
        train = sum(window) / len(window) if window else float("nan")
        cells.append(f"{val.get(s, float('nan')):.3f} / {train:.3f}")
    print(f"{a:<14}" + "".join(f"{c:>16}" for c in cells))
    if any("cost/mean" in r for r in rows[a]):  # Safe-RLHF: the constraint at work
        def mean_over(key, s):
            w = [r[key] for r in rows[a] if s - 50 < r["step"] <= s and key in r]
            return sum(w) / len(w) if w else float("nan")
        print(f"{'  cost':<14}" + "".join(f"{mean_over('cost/mean', s):>16.3f}" for s in steps))
        print(f"{'  lambda':<14}" + "".join(f"{mean_over('lagrangian/lambda', s):>16.3f}" for s in steps))
EOF
