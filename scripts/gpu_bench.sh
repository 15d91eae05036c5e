#!/usr/bin/env bash
# hybridflow at real model sizes on one GPU, side by side with its peers, in one call: builds the CUDA
# configuration (scripts/gpu_build.sh, from the .debs and wheels scripts/gpu_deps.sh put in .gpudeps), measures
# the device's bounds (HBM bandwidth by a device copy, the bf16 matmul peak by a large GEMM), then the cells:
#   decode      batch 1, 64, 256 at ~1024-token contexts (960 prompt + 64 new), Qwen3-1.7B and Qwen3-0.6B shapes,
#               against the step's roofline and transformers' generate (static KV cache, SDPA, bf16)
#   train       forward + backward + AdamW at 1.7B, 8192 tokens a step (4096 on a card under 100 GB; and verl's
#               update on 8k-token packed micro-batches), as a fraction of the measured bf16 matmul peak
#   grpo        one GRPO step at 0.6B (32 prompts x 8, responses up to 512), colocated, against TRL's GRPOTrainer
#   rollout     64 prompts x 8 samples up to 1024 tokens at 0.6B, against transformers' generate
# Models are random-weight directories of the published Qwen3 shapes with the published tokenizer, written by
# transformers (bench/gpu_peers.py make-model), so every side loads the same weights. Every cell has a time
# budget (one slow cell cannot eat the call); the table so far is printed after each group of cells, and at the
# end as markdown into OUT/table.md, with every measurement as JSON lines in OUT/results.jsonl and the whole
# output in OUT/bench.log (OUT: $OUT when set). The GRPO cells run hybridflow and TRL as separate cells.
#
#   bash scripts/gpu_bench.sh                  # on the GPU machine (the device call: docs/toolchain.md)
#   bash scripts/gpu_bench.sh --cpu-smoke      # the same script end to end on the CPU at tiny shapes, against an
#                                              # existing CPU build (build/) and .venv; bash scripts/gpu_deps.sh --smoke first
#   HF_BENCH_BUDGET_S=540 HF_BENCH_SKIP_BUILD=1 HF_BUILD_DIR=build-cuda ...
set -uo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
mode=gpu
[ "${1:-}" = --cpu-smoke ] && mode=smoke
out=${OUT:-runs/gpu_bench}
work=${HF_BENCH_WORK:-/tmp/hf-gpu-bench}
rm -rf "$work"  # fresh models and runs every time
mkdir -p "$out" "$work"
results=$out/results.jsonl
log=$out/bench.log
: > "$results"
: > "$log"
export OMP_WAIT_POLICY=passive PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error

if [ "$mode" = gpu ]; then
  budget=${HF_BENCH_BUDGET_S:-530}
  build=${HF_BUILD_DIR:-build-cuda}
  python=${HF_PYTHON:-python3}
  device=cuda
  site=/tmp/hf-bench-site
  wheels=.gpudeps/wheels
  threads=$(nproc)
  # The shapes (see the header) and each cell's time limit in seconds.
  big=qwen3-1.7b small=qwen3-0.6b
  decode_args=(--batch 1,64,256 --prompt-length 960 --response-length 64)
  peer_decode_args=(--batch 1,64,256 --prompt-length 960 --new-tokens 64)
  # The peer's static cache holds all 512 rollout rows at full length (0.6B: 112 KiB a token, 64 GB at 1152
  # tokens) and the 1.7B step's whole-vocabulary loss about 70 GB in all: on an 80 GB card, shorter prompts and
  # a 4096-token step (hybridflow's own RL update keeps its 8k-token micro-batches).
  gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -n 1)
  rollout_prompt=128 train_rows=8
  [ "${gpu_mib:-0}" -ge 100000 ] || { rollout_prompt=64 train_rows=4; }
  rollout_args=(--rollout-prompts 64 --samples 8 --prompt-length $rollout_prompt --response-length 1024 --stop-every 256
                --max-num-seqs 256)
  peer_rollout_args=(--prompts 64 --samples 8 --prompt-length $rollout_prompt --max-new-tokens 1024 --stop-every 256)
  train_args=(--batch $train_rows --prompt-length 512 --response-length 512 --steps 2 --rl-rows 32 --micro-rows 8
              --stop-every 64)
  grpo_args=(--prompts 32 --group 8 --response-length 512 --steps 2 --warmup 1 --micro 32 --trl-micro 32)
  bounds_args=(--copy-mb 2048 --gemm 8192)
  limit_build=330 limit_decode=60 limit_train=90 limit_grpo=100 limit_rollout=110
  decode_context=992  # the prompt and, on average, half the new tokens
else
  budget=${HF_BENCH_BUDGET_S:-1500}
  build=${HF_BUILD_DIR:-build}
  python=${HF_PYTHON:-.venv/bin/python}
  device=cpu
  site=/tmp/hf-bench-site-smoke
  wheels=.cache/gpubench-wheels
  threads=$(nproc)
  big=tiny small=tiny
  decode_args=(--batch 1,4 --prompt-length 24 --response-length 6)
  peer_decode_args=(--batch 1,4 --prompt-length 24 --new-tokens 6)
  rollout_args=(--rollout-prompts 4 --samples 2 --prompt-length 16 --response-length 24 --stop-every 16 --max-num-seqs 8)
  peer_rollout_args=(--prompts 4 --samples 2 --prompt-length 16 --max-new-tokens 24 --stop-every 16)
  train_args=(--batch 2 --prompt-length 16 --response-length 16 --steps 1 --rl-rows 4 --micro-rows 2 --stop-every 8)
  grpo_args=(--prompts 2 --group 2 --response-length 8 --steps 2 --warmup 1 --micro 4 --trl-micro 2)
  bounds_args=(--copy-mb 64 --gemm 512)
  limit_build=60 limit_decode=120 limit_train=120 limit_grpo=400 limit_rollout=120
  decode_context=27
fi
hf=$build/hybridflow
title="hybridflow on $([ "$mode" = gpu ] && (nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1) || echo "the CPU (smoke run, tiny shapes: the ratios mean nothing)"), bf16"
peers=(bench/gpu_peers.py --device "$device")
deadline=$((start + budget))
status=$work/status.txt
: > "$status"

# cell NAME LIMIT COMMAND...: runs one measurement within min(LIMIT, the time left), its output appended to the
# log; its JSON lines go to results.jsonl, tagged with the cell's name. A cell that fails or runs out of time is
# recorded as such and the next one runs.
cell() {
  local name=$1 limit=$2; shift 2
  local left=$((deadline - SECONDS - 5))
  if [ "$left" -lt 15 ]; then
    echo "$name|skipped: no time left|0" >> "$status"
    echo "== $name: skipped (no time left of the ${budget} s budget)" | tee -a "$log"
    return 1
  fi
  [ "$limit" -lt "$left" ] || limit=$left
  echo "== $name (at most ${limit} s): $*" | tee -a "$log"
  local t0=$SECONDS
  timeout -k 5 "$limit" "$@" > "$work/cell.out" 2>&1
  local rc=$?
  local took=$((SECONDS - t0))
  cat "$work/cell.out" >> "$log"
  grep -v '^{' "$work/cell.out" | tail -n 4
  "$python" - "$name" "$work/cell.out" >> "$results" <<'EOF'
import json, sys
for line in open(sys.argv[2], errors="replace"):
    if line.startswith("{"):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        print(json.dumps({"cell_name": sys.argv[1], **record}))
EOF
  local what=ok
  [ $rc = 0 ] || what="failed (exit $rc)"
  [ $rc = 124 ] || [ $rc = 137 ] && what="stopped at its ${limit} s limit"
  echo "$name|$what|$took" >> "$status"
  echo "-- $name: $what in ${took} s" | tee -a "$log"
  return $rc
}

table() {
  "$python" bench/gpu_bench_table.py --results "$results" --status "$status" --models "$work" --out "$out/table.md" \
    --decode-context "$decode_context" --title "$title"
}

{
  echo "gpu_bench ($mode), $(date -u +%FT%TZ), budget ${budget} s"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())'
} 2>&1 | tee -a "$log"

# The peers' missing packages (TRL and datasets' own needs), from carried wheels, beside the image's.
if ls "$wheels"/*.whl >/dev/null 2>&1; then
  rm -rf "$site"
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheels"/*.whl 2>&1 | tail -n 3
  export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
fi
"$python" -c 'import trl, datasets; print("trl", trl.__version__, "datasets", datasets.__version__)' 2>&1 | tail -n 1 | tee -a "$log"

if [ "$mode" = gpu ] && [ "${HF_BENCH_SKIP_BUILD:-0}" != 1 ]; then
  cell build "$limit_build" env HF_BUILD_DIR="$build" HF_PYTHON="$python" bash scripts/gpu_build.sh hybridflow || { table; exit 1; }
fi
[ -f "$build/hf-env.sh" ] && source "$build/hf-env.sh"
[ -x "$hf" ] || { echo "gpu_bench: $hf not found" | tee -a "$log"; exit 1; }

cell bounds 60 "$python" "${peers[@]}" bounds "${bounds_args[@]}"
tokenizer=.gpudeps/tokenizer
for shape in $(printf '%s\n' $big $small | sort -u); do
  cell "model $shape" 90 "$python" "${peers[@]}" make-model --shape "$shape" --out "$work/$shape" --tokenizer "$tokenizer"
done
common=(--device "$device" --dtype bf16 --threads "$threads" --json)

cell "decode $big" "$limit_decode" "$hf" bench generate "${common[@]}" --model "$work/$big" "${decode_args[@]}" --rollout-prompts 1 --samples 1 --no-static-baseline
cell "decode $big peer" "$limit_decode" "$python" "${peers[@]}" hf-decode --model "$work/$big" "${peer_decode_args[@]}"
table
cell "train $big" "$limit_train" "$hf" bench train "${common[@]}" --model "$work/$big" "${train_args[@]}"
table
# The two sides in cells of their own (the same prompts, drawn from one seed): each gets its own time.
grpo=("$python" bench/grpo_vs_trl.py --hybridflow "$hf" --model "$work/$small" --device "$device" --dtype bf16
      --threads "$threads" --no-cpu-time "${grpo_args[@]}")
cell "grpo $small" "$limit_grpo" "${grpo[@]}" --sides dynamic --out "$work/grpo"
cell "grpo $small peer" "$limit_grpo" "${grpo[@]}" --sides trl --out "$work/grpo_trl"
table
cell "rollout $small" "$limit_rollout" "$hf" bench generate "${common[@]}" --model "$work/$small" --rollout-only --no-static-baseline "${rollout_args[@]}"
cell "rollout $small peer" "$limit_rollout" "$python" "${peers[@]}" hf-rollout --model "$work/$small" "${peer_rollout_args[@]}"
if [ "$small" != "$big" ]; then
  cell "decode $small" "$limit_decode" "$hf" bench generate "${common[@]}" --model "$work/$small" "${decode_args[@]}" --rollout-prompts 1 --samples 1 --no-static-baseline
  cell "decode $small peer" "$limit_decode" "$python" "${peers[@]}" hf-decode --model "$work/$small" "${peer_decode_args[@]}"
fi
echo "gpu_bench: $((SECONDS - start)) s in all" | tee -a "$log"
table
