#!/usr/bin/env bash
# Checks a CUDA build of hybridflow on a machine with a GPU: the build sees the device, the GPU computes what
# the CPU computes (tests/engine/test_cuda_parity.cpp: forward, log-probs, generation, fp32 and bf16
# training steps, NCCL; the grouped expert GEMM and varlen flash attention against the loops they replace;
# the batch-invariant mode's log-probs bit for bit, tests/engine/test_batch_invariant_cuda.cpp),
# and the main job (SFT, then PPO) trains on the GPU as it does on the CPU. With --suite it
# also runs every CTest test of the build (RL tests then run on the GPU: trainer.device is auto).
#
#   HF_CUDA=1 bash scripts/build.sh && [PPO_STEPS=100] bash scripts/gpu_check.sh [--build DIR] [--out DIR] [--suite]
#
# Prints one summary table at the end (and writes it to OUT/gpu_check.md); exits non-zero if any check failed.
set -uo pipefail
cd "$(dirname "$0")/.."
build=build-cuda
out=runs/gpu_check
suite=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --suite) suite=1; shift ;;
    *) echo "gpu_check: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
hf=$build/hybridflow
[ -x "$hf" ] || { echo "gpu_check: $hf not found; build with HF_CUDA=1 bash scripts/build.sh" >&2; exit 2; }
mkdir -p "$out"
export OMP_WAIT_POLICY=passive
summary="$out/gpu_check.md"
: > "$summary"
failed=0

# step NAME COMMAND...: runs a check with its output in OUT/NAME.log, timed, recorded in the summary.
step() {
  local name=$1; shift
  local start=$SECONDS
  echo "== $name: $*"
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$out/$name.log"
  echo "| $name | $([ $rc = 0 ] && echo ok || echo "FAILED (exit $rc)") | $((SECONDS - start)) s |" >> "$summary"
  [ $rc = 0 ] || failed=1
  return $rc
}

# The last record's value of a metric in a metrics.jsonl, and the mean of another over all records.
metric() { python3 - "$@" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
key = sys.argv[2]
vals = [r[key] for r in rows if r.get(key) is not None]
mode = sys.argv[3] if len(sys.argv) > 3 else "last"
if not vals: print("n/a")
elif mode == "last": print(f"{vals[-1]:.4g}")
elif mode == "mean": print(f"{sum(vals) / len(vals):.4g}")
else:  # mean of the records from index mode on
    tail = vals[int(mode):]
    print(f"{sum(tail) / len(tail):.4g}")
EOF
}

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
step info "$hf" info
[ -x "$build/test_cuda_parity" ] && step cuda_parity "$build/test_cuda_parity"
[ -x "$build/test_batch_invariant_cuda" ] && step batch_invariant_cuda "$build/test_batch_invariant_cuda"

run=$out/main_job
rm -rf "$run"
step init "$hf" init --preset tiny --task addition --seed 0 --out "$run/init"
step sft_cuda "$hf" sft --config examples/sft_addition.yaml model.path="$run/init" trainer.out_dir="$run/sft" trainer.device=cuda
ppo_args=(--config examples/ppo_addition.yaml model.path="$run/sft/final" data.train_file="$run/sft/data/train.jsonl"
          data.test_file="$run/sft/data/test.jsonl" trainer.save_checkpoint=false trainer.logger=[console,jsonl])
step ppo_cuda "$hf" train "${ppo_args[@]}" trainer.device=cuda trainer.run_dir="$run/ppo_cuda" trainer.total_steps=${PPO_STEPS:-100}
step ppo_cuda_bf16 "$hf" train "${ppo_args[@]}" trainer.device=cuda trainer.run_dir="$run/ppo_cuda_bf16" \
    trainer.total_steps=30 actor_rollout_ref.actor.dtype=bf16 critic.dtype=bf16
step ppo_cpu "$hf" train "${ppo_args[@]}" trainer.device=cpu trainer.run_dir="$run/ppo_cpu" trainer.total_steps=30

{
  echo
  echo "| run | held-out at the end | training reward, last 10 steps | seconds per step (mean after step 5) |"
  echo "|---|---|---|---|"
  for r in ppo_cuda ppo_cuda_bf16 ppo_cpu; do
    m="$run/$r/metrics.jsonl"
    [ -f "$m" ] || continue
    echo "| $r | $(metric "$m" val/score) | $(metric "$m" score/mean -10) | $(metric "$m" timing/step_s 5) |"
  done
} >> "$summary"

if [ "$suite" = 1 ]; then
  step ctest ctest --test-dir "$build" --output-on-failure -j "$(( $(nproc) / 2 ))" --timeout 600
fi

echo
echo "| check | result | time |"
echo "|---|---|---|"
cat "$summary"
exit $failed
