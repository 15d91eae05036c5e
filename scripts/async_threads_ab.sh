#!/usr/bin/env bash
# Speed of asynchronous GRPO against the synchronous run by intra-op threads per process (docs/async.md,
# "Threads per process"): examples/grpo_async_sort.yaml at rollout.staleness 0 and 1, each with
# trainer.threads_per_worker 1 and 2, alternated in rounds so that a drifting load hits every variant alike.
# Each run also samples, over 3 seconds halfway through, the threads of the controller and of each worker
# process that used more than a tenth of a core. Prints one line per run and the medians.
# Needs the fine-tuned start model and data of scripts/async_curves.sh (run it once first).
#   ROUNDS=5 STEPS=100 HF_RUN_DIR=runs/async VARIANTS="s0t2 s1t1 s0t1 s1t2" (sN = staleness N, tM = M threads;
#   a trailing g streams groups: rollout.stream_groups, docs/async.md "Streamed groups")
#   EXTRA="actor_rollout_ref.rollout.max_num_seqs=4": more overrides for every run (here: fewer rollout slots,
#   so that the rollout is the slower side)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${HF_BUILD_DIR:-build}
hf=$build_dir/hybridflow
[ -x "$hf" ] || { echo "no $hf: build it first (bash scripts/build.sh hybridflow)"; exit 1; }
export OMP_WAIT_POLICY=passive
run=${HF_RUN_DIR:-runs/async}
[ -f "$run/sft/final/config.json" ] || { echo "no $run/sft/final: run scripts/async_curves.sh once first"; exit 1; }
rounds=${ROUNDS:-5}
steps=${STEPS:-100}
read -r -a variants <<< "${VARIANTS:-s0t2 s1t1 s0t1 s1t2}"
out="$run/threads_ab"
mkdir -p "$out"

# For the controller (pid $1) and each worker it forked: the threads that used more than 10% of a core over
# 3 seconds, as "role busy/all".
busy_threads() {
  python3 - "$1" <<'EOF'
import os, sys, time
controller = sys.argv[1]
pids = {controller: "controller"}
for entry in os.listdir("/proc"):
    try:
        if entry.isdigit() and open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1] == controller:
            pids[entry] = open(f"/proc/{entry}/cmdline").read().replace("\0", " ").split()[2]  # "hybridflow worker ROLE rank N"
    except (OSError, IndexError):
        pass
def ticks(pid):
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
            out[tid] = int(fields[11]) + int(fields[12])  # utime + stime
        except (OSError, IndexError):
            pass
    return out
try:
    before = {p: ticks(p) for p in pids}; time.sleep(3); after = {p: ticks(p) for p in pids}
except OSError:
    print("-"); sys.exit()
hz = os.sysconf("SC_CLK_TCK")
print(", ".join(f"{name} {sum(1 for t, v in after[p].items() if (v - before[p].get(t, v)) / hz > 0.3)}/{len(after[p])}"
                for p, name in pids.items()))
EOF
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) at $(date -u +%H:%M:%S) UTC"
for round in $(seq 1 "$rounds"); do
  for v in "${variants[@]}"; do
    [[ $v =~ ^s([0-9]+)t([0-9]+)(g?)$ ]] || { echo "VARIANTS: '$v' is not sNtM or sNtMg"; exit 1; }
    stream=false; [ -n "${BASH_REMATCH[3]}" ] && stream=true
    dir="$out/r${round}_$v"
    rm -rf "$dir"
    start=$(date +%s.%N)
    "$hf" train --config examples/grpo_async_sort.yaml model.path="$run/sft/final" trainer.run_dir="$dir" \
        data.train_file="$run/data/train.jsonl" data.test_file="$run/data/test.jsonl" \
        actor_rollout_ref.rollout.staleness="${BASH_REMATCH[1]}" trainer.threads_per_worker="${BASH_REMATCH[2]}" \
        actor_rollout_ref.rollout.stream_groups="$stream" ${EXTRA:-} \
        trainer.total_steps="$steps" trainer.test_freq=0 trainer.save_checkpoint=false > "$dir.log" 2>&1 &
    pid=$!
    # Halfway: the controller's and each worker's busy threads.
    while [ "$({ wc -l < "$dir/metrics.jsonl"; } 2>/dev/null || echo 0)" -lt $((steps / 2)) ] && kill -0 $pid 2>/dev/null; do
      sleep 0.2
    done
    threads=$(busy_threads $pid)
    wait $pid || { cat "$dir.log"; exit 1; }
    wall=$(echo "$(date +%s.%N) - $start" | bc)
    echo "$v round $round: wall $wall s; busy threads (of all) $threads; load $(cut -d' ' -f1 /proc/loadavg)" \
      | tee -a "$out/runs.txt"
    echo "$wall" > "$dir.wall"
  done
done

python3 - "$out" "$rounds" "${variants[@]}" <<'EOF'
import json, statistics, sys
out, rounds, variants = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def figures(v, r):
    d = f"{out}/r{r}_{v}"
    rows = [row for row in map(json.loads, open(f"{d}/metrics.jsonl")) if row["step"] > 0]  # 0: validation
    step_s = [row["timing/step_s"] for row in rows]
    return {"wall": float(open(f"{d}.wall").read()), "steps_s": sum(step_s),
            "steady": statistics.mean(step_s[2:]), "idle": sum(row.get("timing/trainer_idle_s", 0) for row in rows) / sum(step_s),
            "ahead": sum(row.get("rollout/stream_groups_ahead", 0) for row in rows),
            "continued": sum(row.get("rollout/streamed_groups", 0) for row in rows)}
f = {v: [figures(v, r) for r in range(1, rounds + 1)] for v in variants}
print(f"\n{'variant':8} {'wall s (median)':>16} {'step s (median)':>16} {'s/step after 2':>15} {'waiting':>8}"
      f" {'groups continued / ahead (median)':>34}")
for v in variants:
    med = lambda k: statistics.median(x[k] for x in f[v])
    print(f"{v:8} {med('wall'):16.2f} {med('steps_s'):16.2f} {med('steady'):15.3f} {med('idle'):8.0%}"
          f" {med('continued'):>25.0f} / {med('ahead'):.0f}")
base = variants[0]
for v in variants[1:]:
    ratios = [a["steps_s"] / b["steps_s"] for a, b in zip(f[base], f[v])]
    print(f"speed-up of {v} over {base} per round (step seconds): " + " ".join(f"{x:.2f}x" for x in ratios) +
          f"; median {statistics.median(ratios):.2f}x")
EOF
