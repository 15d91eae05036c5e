#!/usr/bin/env bash
# Learning curves of asynchronous GRPO (docs/async.md, "Measured"): examples/grpo_async_sort.yaml, a standalone
# rollout on one process and the trainer on the other, at rollout.staleness 0, 1, 2 and 4, each without and
# with partial rollouts, run one after the other, then the synchronous run once more to show how the load on
# the machine drifted. Each run saves its actor every EVAL_EVERY steps; the held-out greedy score of every
# checkpoint is measured afterwards (outside the runs, so that evaluating does not pause a run while its
# rollout pool keeps generating). Prints one table: score against step and against the run's seconds, tokens
# per second, per-token staleness, the share of the trainer's time spent waiting for rollouts, and the
# planner's (hybridflow plan --staleness k) predicted seconds per step and speed-up beside the measured ones.
# Makes its own data and fine-tuned start model (sort of 1-24 digits: responses of 2 to 25 tokens) when
# missing. The sweep took 18 minutes on 2 loaded cores (2 minutes a run), the fine-tuning 13 the first time.
#   STEPS=300 EVAL_EVERY=50 HF_RUN_DIR=runs/async   RUNS="s0 s2p" (default: all nine; sN = staleness N,
#   a trailing p = with partial rollouts). To compare speeds under a drifting load, alternate short runs in
#   rounds, each round in a run directory of its own holding links to the first one's sft/ and data/:
#   for r in 1 2 3; do STEPS=100 EVAL_EVERY=100 RUNS="s0 s2 s4" HF_RUN_DIR=runs/async_ab$r bash scripts/async_curves.sh; done
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${HF_BUILD_DIR:-build}
[ -x "$build_dir/hybridflow" ] || bash scripts/build.sh hybridflow
export OMP_WAIT_POLICY=passive
hf=$build_dir/hybridflow
run=${HF_RUN_DIR:-runs/async}
steps=${STEPS:-300}
every=${EVAL_EVERY:-50}
config=examples/grpo_async_sort.yaml
response_length=28

if [ ! -f "$run/sft/final/config.json" ]; then
  "$hf" data --task sort --min-length 1 --max-length 24 --train-size 20000 --test-size 200 --out "$run/data"
  "$hf" init --preset tiny --task sort --seed 0 --out "$run/init"
  # 400 steps leave the model imperfect (held-out exact match about 0.6): room for RL. 5-13 minutes.
  "$hf" sft --config examples/sft_addition.yaml model.path="$run/init" data.task=sort \
      data.train_file="$run/data/train.jsonl" data.test_file="$run/data/test.jsonl" trainer.steps=400 \
      trainer.batch_size=128 trainer.micro_batch_size=128 trainer.max_new_tokens=$response_length \
      trainer.out_dir="$run/sft" | grep -v "^step"
fi

declare -A staleness=([s0]=0 [s0p]=0 [s1]=1 [s1p]=1 [s2]=2 [s2p]=2 [s4]=4 [s4p]=4 [s0again]=0)
read -r -a names <<< "${RUNS:-s0 s0p s1 s1p s2 s2p s4 s4p s0again}"
mkdir -p "$run/curves"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) at $(date -u +%H:%M:%S) UTC"
for name in "${names[@]}"; do
  [[ -v "staleness[$name]" ]] || { echo "RUNS: unknown run '$name' (expected: ${!staleness[*]})"; exit 1; }
  dir="$run/curves/$name"
  rm -rf "$dir"
  partial=false; [[ $name == *p ]] && partial=true
  "$hf" train --config "$config" model.path="$run/sft/final" trainer.run_dir="$dir" \
      data.train_file="$run/data/train.jsonl" data.test_file="$run/data/test.jsonl" \
      actor_rollout_ref.rollout.staleness="${staleness[$name]}" actor_rollout_ref.rollout.partial_rollout=$partial \
      trainer.total_steps="$steps" trainer.test_freq=0 trainer.save_checkpoint=true trainer.save_freq="$every" \
      > "$dir.log" 2>&1 || { cat "$dir.log"; exit 1; }
  for ckpt in "$dir"/checkpoints/step_*; do
    "$hf" generate "$ckpt/actor" --prompts-file "$run/data/test.jsonl" --task sort --greedy \
        --max-new-tokens $response_length | grep "^mean score" > "$ckpt/heldout.txt"
  done
  echo "$name done at $(date -u +%H:%M:%S) UTC, load $(cut -d' ' -f1-3 /proc/loadavg)"
done

# The planner's view of the same run: calibrated on this machine (once), then staleness 0, 1, 2, 4. The
# example has no KL term, so the trainer runs no reference model: --reference off.
calibration=${HF_CALIBRATION:-${XDG_CACHE_HOME:-$HOME/.cache}/hybridflow/calibration.json}
[ -f "$calibration" ] || "$hf" plan --calibrate > "$run/calibrate.log" 2>&1 || cat "$run/calibrate.log"
prompt_length=$(python3 -c "import json,sys; r=[len(json.loads(l)['prompt']) for l in open(sys.argv[1])]; print(round(sum(r)/len(r)))" "$run/data/train.jsonl")
"$hf" plan --gpu this-machine --gpus 2 --model "$run/sft/final" --algorithm grpo --batch 16 --n 4 \
    --mini-batches 1 --prompt-length "$prompt_length" --response-length $response_length --reference off \
    --max-num-seqs 8 \
    --staleness 4 --json \
    > "$run/plan.json" 2> "$run/plan.log" || { cat "$run/plan.log"; rm -f "$run/plan.json"; }

python3 scripts/async_curves_table.py "$run" "$every" "${names[@]}"
