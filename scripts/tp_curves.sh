#!/usr/bin/env bash
# PPO with critic, reference (KL loss) and a learned reward model on 4 processes, twice from the same seed:
# every role split over t = 2 tensor-parallel ranks with the actor generating at t_g = 1 through the
# 3D-HybridEngine, and every role unsplit (t = 1, 4 data-parallel ranks). Prints both reward curves side by
# side and the engine's measured switch. Needs the main job's SFT model (runs scripts/quickstart.sh first
# when missing) and trains the reward model of examples/rm_addition.yaml when missing.
# Usage: bash scripts/tp_curves.sh [steps] (default 150)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-150}
bash scripts/setup.sh
bash scripts/build.sh hybridflow
export OMP_WAIT_POLICY=passive
hf=${HF_BUILD_DIR:-build}/hybridflow
run=${HF_RUN_DIR:-runs/quickstart}
out=${HF_CURVES_DIR:-runs/tp_curves}
[ -f "$run/sft/final/config.json" ] || bash scripts/quickstart.sh
rm_dir=runs/rm_addition/final
[ -f "$rm_dir/config.json" ] || "$hf" rm --config examples/rm_addition.yaml model.path="$run/sft/final" 2>&1 | tail -3

for t in 2 1; do
  echo "== t=$t for every role, generation t_g=1, 4 processes"
  rm -rf "${out:?}/t$t"
  "$hf" train --config examples/ppo_addition.yaml model.path="$run/sft/final" trainer.run_dir="$out/t$t" \
      data.train_file="$run/sft/data/train.jsonl" data.test_file="$run/sft/data/test.jsonl" \
      trainer.total_steps="$steps" trainer.test_freq=50 trainer.log_every=50 trainer.save_checkpoint=false \
      actor_rollout_ref.num_processes=4 trainer.placement=colocate actor_rollout_ref.actor.use_kl_loss=true \
      reward_model.enable=true reward_model.path="$rm_dir" \
      actor_rollout_ref.actor.megatron.tensor_model_parallel_size=$t \
      actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
      critic.megatron.tensor_model_parallel_size=$t reward_model.megatron.tensor_model_parallel_size=$t \
      2>&1 | grep -E "held-out|^step"
done

python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
rows = {t: [json.loads(l) for l in open(f"{out}/t{t}/metrics.jsonl")] for t in (1, 2)}
last = max(r["step"] for r in rows[1])
print(f"\n{'steps':<12}{'reward t=1':>12}{'reward t=2':>12}{'rm t=1':>10}{'rm t=2':>10}{'s/step t=1':>12}{'s/step t=2':>12}")
for lo in range(0, last, 25):
    cells = []
    for key in ("score/rule_mean", "score/rm_mean", "timing/step_s"):
        for t in (1, 2):
            w = [r[key] for r in rows[t] if lo < r["step"] <= lo + 25 and key in r]
            cells.append(sum(w) / len(w) if w else float("nan"))
    print(f"{lo + 1:>4}-{lo + 25:<7}{cells[0]:>12.3f}{cells[1]:>12.3f}{cells[2]:>10.3f}{cells[3]:>10.3f}{cells[4]:>12.3f}{cells[5]:>12.3f}")
for t in (1, 2):
    val = [(r["step"], r["val/score"]) for r in rows[t] if "val/score" in r]
    print(f"held-out t={t}: " + ", ".join(f"step {s}: {v:.3f}" for s, v in val))
r = [r for r in rows[2] if "reshard/model_bytes" in r]
if r:
    m = sum(x["reshard/model_bytes"] for x in r) / len(r)
    g = sum(x["reshard/to_generation_bytes_received"] for x in r) / len(r)
    print(f"3D-HybridEngine t=2 -> t_g=1 per rank: M = {m / 1e6:.3f} MB, received {g / 1e6:.3f} MB (paper: M/2), "
          f"peak extra {r[-1]['reshard/peak_extra_weight_bytes'] / 1e6:.3f} MB, redundant {r[-1]['reshard/redundant_bytes']:.0f} B, "
          f"switch {1e3 * sum(x['reshard/to_generation_s'] + x['reshard/to_training_s'] for x in r) / len(r):.2f} ms")
PY
