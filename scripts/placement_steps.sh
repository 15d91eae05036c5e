#!/usr/bin/env bash
# Seconds per PPO step under each placement on this machine (docs/placement.md, "Measured here"): the same
# run (actor, critic, reward = the task's rule) as colocate, split, standalone on-policy and standalone
# one-step off-policy, each ROUNDS times in alternation so that load from other processes spreads over all
# of them. Prints, per placement, the median over rounds of the mean step time over the steps after the
# first two (warm-up), the stage times of the last round, and the load average before and after.
#   HF_PLACEMENT_ARGS="model.preset=small ..."   extra overrides for every run
#   ROUNDS=2 STEPS=10
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${HF_BUILD_DIR:-build}
[ -x "$build_dir/hybridflow" ] || bash scripts/build.sh hybridflow
export OMP_WAIT_POLICY=passive
rounds=${ROUNDS:-2}
steps=${STEPS:-10}
out=$(mktemp -d)
common=(algorithm.adv_estimator=gae data.task=addition data.max_digits=2 data.train_size=512 data.test_size=0
        data.train_batch_size=32 actor_rollout_ref.rollout.n=2 actor_rollout_ref.rollout.response_length=8
        actor_rollout_ref.actor.ppo_mini_batch_size=16 critic.ppo_mini_batch_size=16
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32 critic.ppo_micro_batch_size_per_gpu=32
        trainer.total_steps="$steps" trainer.log_every=1000 trainer.logger=[jsonl] trainer.log_samples_freq=0)
declare -A placements=(
  [colocate]="trainer.placement=colocate"
  [split]="trainer.placement=split"
  [standalone0]="trainer.placement=standalone actor_rollout_ref.rollout.staleness=0"
  [standalone1]="trainer.placement=standalone actor_rollout_ref.rollout.staleness=1"
)
order=(colocate split standalone0 standalone1)
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "$rounds"); do
  for name in "${order[@]}"; do
    dir="$out/$name-$round"
    # shellcheck disable=SC2086
    "$build_dir/hybridflow" train "${common[@]}" ${placements[$name]} ${HF_PLACEMENT_ARGS:-} trainer.run_dir="$dir" \
      > "$dir.log" 2>&1 || { cat "$dir.log"; exit 1; }
  done
done
echo "load after:  $(cut -d' ' -f1-3 /proc/loadavg)"
.venv/bin/python - "$out" "$rounds" "${order[@]}" <<'PY'
import json, statistics, sys
out, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print(f"{'placement':<14} {'s/step (median of rounds)':>26}  rounds  stages of the last round (s/step)")
for name in names:
    means, last = [], None
    for r in range(1, rounds + 1):
        rows = [x for x in map(json.loads, open(f"{out}/{name}-{r}/metrics.jsonl")) if x["step"] > 0][2:]
        means.append(statistics.mean(row["timing/step_s"] for row in rows))
        last = rows
    stages = {}
    for row in last:
        for k, v in row.items():
            if k.startswith("timing/") and k != "timing/step_s" and v is not None:
                stages[k[7:-2]] = stages.get(k[7:-2], 0) + v / len(last)
    detail = ", ".join(f"{k} {v:.3f}" for k, v in sorted(stages.items(), key=lambda kv: -kv[1]))
    print(f"{name:<14} {statistics.median(means):>26.3f}  {' '.join(f'{m:.3f}' for m in means)}  {detail}")
PY
rm -rf "$out"
