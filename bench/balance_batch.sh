#!/usr/bin/env bash
# trainer.balance_batch on and off in the same run: GRPO on 2 data-parallel actor processes over prompts whose
# lengths follow a long tail (the addition task's digits, lognormal, 11-194 tokens; shuffled as a run draws them),
# the runs alternated, each side's median actor update, old log-prob pass and step over steps 2-8 and the ranks'
# token spread
# (verl's global_seqlen/* metrics). Not part of CI; builds the hybridflow binary first.
#   bash bench/balance_batch.sh [--rounds 3] [--no-packing]   (extra key=value overrides go to both sides)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3
packing=true
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --no-packing) packing=false; shift ;;
    *) extra+=("$1"); shift ;;
  esac
done
bash scripts/build.sh hybridflow >/dev/null
export OMP_WAIT_POLICY=passive
bin="$PWD/${HF_BUILD_DIR:-build}/hybridflow"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work/train.jsonl" <<'PY'
import json, math, random, sys
random.seed(3)
with open(sys.argv[1], "w") as f:
    for _ in range(256):
        n = int(min(190, max(4, math.exp(random.gauss(3.8, 0.8)))))
        a = "".join(random.choice("0123456789") for _ in range(n))
        b = str(random.randint(0, 99))
        f.write(json.dumps({"prompt": a + "+" + b + "=", "response": str(int(a) + int(b))}) + "\n")
PY
run() {  # $1: true | false, $2: run name
  "$bin" train algorithm.adv_estimator=grpo data.task=addition data.train_file="$work/train.jsonl" data.test_size=0 \
    data.max_prompt_length=224 data.train_batch_size=16 actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.response_length=32 actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096 \
    actor_rollout_ref.model.use_remove_padding=$packing actor_rollout_ref.num_processes=2 \
    model.hidden_size=256 model.num_hidden_layers=4 model.num_attention_heads=4 model.num_key_value_heads=2 \
    model.intermediate_size=768 trainer.total_steps=8 trainer.log_samples_freq=0 trainer.seed=1 \
    trainer.run_dir="$work/$2" trainer.balance_batch="$1" "${extra[@]}" >"$work/$2.log" 2>&1 ||
    { cat "$work/$2.log"; exit 1; }
}
for r in $(seq 1 "$rounds"); do
  run true "on$r"
  run false "off$r"
done
python3 - "$work" "$rounds" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
def steps(name):
    return [r for r in map(json.loads, open(f"{work}/{name}/metrics.jsonl")) if r["step"] > 0][1:]
side = {}
for s in ("on", "off"):
    rows = [r for i in range(1, rounds + 1) for r in steps(f"{s}{i}")]
    side[s] = (statistics.median(r["timing/update_actor_s"] for r in rows), statistics.median(r["timing/step_s"] for r in rows),
               statistics.median(r["timing/old_log_prob_s"] for r in rows))
on = [r for i in range(1, rounds + 1) for r in steps(f"on{i}")]
spread = statistics.mean(r["global_seqlen/minmax_diff"] for r in on)
balanced = statistics.mean(r["global_seqlen/balanced_max"] - r["global_seqlen/balanced_min"] for r in on)
mean = statistics.mean(r["global_seqlen/mean"] for r in on)
print(f"tokens per rank {mean:.0f}: spread in batch order {spread:.0f}, balanced {balanced:.1f}")
print(f"actor update median: balanced {side['on'][0]:.3f} s, in order {side['off'][0]:.3f} s "
      f"({side['off'][0] / side['on'][0]:.3f}x)")
print(f"old log-probs median: balanced {side['on'][2]:.3f} s, in order {side['off'][2]:.3f} s "
      f"({side['off'][2] / side['on'][2]:.3f}x)")
print(f"step median:         balanced {side['on'][1]:.3f} s, in order {side['off'][1]:.3f} s "
      f"({side['off'][1] / side['on'][1]:.3f}x)")
PY
