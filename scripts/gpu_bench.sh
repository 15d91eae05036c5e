#!/usr/bin/env bash
# hybridflow at real model sizes on one GPU, side by side with its peers, in one call: builds the CUDA
# configuration (scripts/gpu_build.sh, from the .debs and wheels scripts/gpu_deps.sh put in .gpudeps), measures
# the device's bounds (HBM bandwidth by a device copy, the bf16 matmul peak by a large GEMM), then the cells,
# the most informative first (a cell the budget cannot fit is skipped and says so):
#   decode      batch 1, 64, 256 at 1024-token contexts (992 prompt + 32 new), Qwen3-1.7B, against the step's
#               roofline and transformers' generate (static KV cache, SDPA, bf16); both sides time decode alone
#               (a run of N new tokens less a run of 1, so the prefill cancels) and prefill apart
#   profile     Kineto (libtorch's profiler, from C++) over 4 decode steps at 1.7B, batch 1 and 64: operators,
#               kernels and launches per step, device-busy time against wall time, the top operators by device
#               self time; the Chrome traces gzipped into OUT (`bench generate --profile`)
#   attn-v2     the 1.7B decode (graphs) and, in the second call, its profile again with HF_PAGED_ATTENTION=v2
#               (the second paged-attention kernels, opt-in until a GPU has measured them), beside the default
#   gemv        in the second call, after its training cells: the 1.7B decode (graphs) at batch 1 and its profile
#               again with HF_DECODE_GEMV=on (the few-rows projection kernels, opt-in until a GPU has measured them)
#   rollout     64 prompts x 8 samples up to 256 tokens at 0.6B (a stop token each step with p = 1/64, prompts
#               joining in groups of a quarter of the 256 places; the second call, after its training cells, also
#               with --admission-rows 0, and with every prompt after the same 512 ids against prefix caching off,
#               --shared-prefix),
#               against transformers' generate (the first run's 1024 tokens, p = 1/256, took over 100 s); the
#               graphs cell also times the next rollout on the KV pools and graphs the first kept (--kept-pools)
#   grpo        one GRPO step at 0.6B (32 prompts x 8, responses up to 128), colocated, against TRL's GRPOTrainer;
#               free_cache_engine false, so the timed steps replay the graphs the warm-up step captured
#   profile     last, where time is left: one training step at 1.7B under Kineto (`bench train --profile`)
#   decode      the decode cells again at 0.6B
# One device call cannot hold them all (the first, build included, used 526 s of 530 and cut the rest), so a
# second call, issued right after the first returns while the machine is still warm, runs the rest:
#   --rest      no build (build-cuda is kept while the machine is warm; built only where it is missing), the
#               models in the work folder reused (made where missing), then within its own budget
#               (HF_BENCH_BUDGET_S, default 240 s): test_cuda_parity in full; the training cell, which runs only
#               here: forward + backward + AdamW at 1.7B, 8192 tokens a step (4096 on a card under 100 GB; and
#               verl's update on 8k-token packed micro-batches), as a fraction of the measured bf16 matmul peak;
#               the GRPO cell's update under the trainer's own profiler (global_profiler: its phases' device time);
#               every cell the first call skipped or stopped at its limit (its status file in the work folder
#               says which; without one, the cells it usually leaves); test_batch_invariant_cuda in full (the
#               batch-invariant cost among its tests). Its lines join the first call's in OUT/results.jsonl and
#               OUT/table.md (the work folder keeps the first call's), its output goes to OUT/bench-rest.log.
# Sizes are cut so that every cell fits the budget at the speeds measured on an H200 (decode at 1.7B: ~29 ms
# a token at batch 1, ~84 ms a step at batch 64); the table prints every cell's sizes. Models are
# random-weight directories of the published Qwen3 shapes with the published tokenizer, written by transformers
# (bench/gpu_peers.py make-model), so every side loads the same weights. Every cell has a time limit (one slow
# cell cannot eat the call); the table so far is printed after each group of cells, and at the end as markdown
# into OUT/table.md, with every measurement as JSON lines in OUT/results.jsonl and the whole output in
# OUT/bench.log (OUT: $OUT when set). The GRPO cells run hybridflow and TRL as separate cells.
#
#   bash scripts/gpu_bench.sh                  # on the GPU machine (the two device calls: docs/toolchain.md)
#   bash scripts/gpu_bench.sh --rest           # the second call, right after the first
#   bash scripts/gpu_bench.sh --cpu-smoke      # the same script end to end on the CPU at tiny shapes, against an
#                                              # existing CPU build (build/) and .venv; bash scripts/gpu_deps.sh --smoke first
#   bash scripts/gpu_bench.sh --cpu-smoke --rest  # then its second part on the CPU
#   HF_BENCH_BUDGET_S=540 HF_BENCH_SKIP_BUILD=1 HF_BUILD_DIR=build-cuda ...
#   HF_BENCH_GENERATE_FLAGS="--kv-block-size 32"   # appended to every hybridflow `bench generate` cell
#   HF_BENCH_VARIANT_FLAGS="--cuda-graphs" HF_BENCH_VARIANT_NAME=graphs
#                                              # adds cells "decode qwen3-1.7b graphs", "profile qwen3-1.7b graphs"
#                                              # and "rollout qwen3-0.6b graphs": the same work with these flags,
#                                              # each right after its plain cell, in the table beside it
#                                              # (OUT then holds 8 files: the device call returns no more)
#                                              # On a GPU "--cuda-graphs --readback-interval 8" is the default
#                                              # variant (HF_BENCH_VARIANT_FLAGS= turns it off), after a "decode
#                                              # parity" cell: test_cuda_parity's graph-vs-eager, chunked read-back
#                                              # and fused-decode-kernel tests, built with hybridflow
set -uo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
mode=gpu part=1
for arg in "$@"; do
  case $arg in
    --cpu-smoke) mode=smoke ;;
    --rest) part=2 ;;
    *) echo "gpu_bench: unknown argument '$arg' (expected --cpu-smoke and/or --rest)" >&2; exit 2 ;;
  esac
done
out=${OUT:-runs/gpu_bench}
work=${HF_BENCH_WORK:-/tmp/hf-gpu-bench}
# Every measurement goes to the work folder's results.jsonl (copied into OUT with each table): the device
# returns a fresh OUT per call, and the second call's table holds both calls' lines.
if [ "$part" = 1 ]; then
  rm -rf "$work"  # fresh models and runs every time
  mkdir -p "$out" "$work"
  : > "$work/results.jsonl"
  log=$out/bench.log
else
  mkdir -p "$out" "$work"
  touch "$work/results.jsonl"
  log=$out/bench-rest.log
fi
results=$work/results.jsonl
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
  # The shapes (see the header), the cells' sizes and each cell's time limit in seconds.
  big=qwen3-1.7b small=qwen3-0.6b
  decode_batches=1,64,256 decode_prompt=992 decode_new=32 decode_reps=1
  profile_batches=1,64 profile_steps=4
  # The peer's static cache holds all 512 rollout rows at full length (0.6B: 112 KiB a token) and the 1.7B
  # step's whole-vocabulary loss about 70 GB in all: on an 80 GB card, shorter prompts and a 4096-token step
  # (hybridflow's own RL update keeps its 8k-token micro-batches).
  gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -n 1)
  rollout_prompt=128 train_rows=8
  [ "${gpu_mib:-0}" -ge 100000 ] || { rollout_prompt=64 train_rows=4; }
  rollout_prompts=64 rollout_samples=8 rollout_new=256 rollout_stop=64 rollout_seqs=256 rollout_shared=512
  train_args=(--batch $train_rows --prompt-length 512 --response-length 512 --steps 1 --rl-rows 32 --micro-rows 8
              --stop-every 64)
  grpo_prompts=32 grpo_group=8 grpo_new=128 grpo_steps=2
  # hybridflow's update and old log-probs take the step's 256 samples as one token budget (its head never holds
  # [tokens x vocabulary] logits: ~50 GB at most, `hybridflow info`); 32 rows a micro-batch made eight, and the
  # update's ~35k operators each (a CPU profile at this depth) looked host-bound at the H200's 4.18 s. The
  # profile cell of the second call keeps 32 to test that. TRL's full-vocabulary float32 logits (12 GB at 32
  # rows x 640 tokens) keep it at 32.
  # free_cache_engine false: the rollout's KV pools and CUDA graphs stay between steps (the warm-up step
  # captures them, the timed steps replay them), as vLLM's sleep mode keeps verl's graphs; the pool then takes
  # 0.3 of the card (~43 GB) beside the update's ~50 GB.
  grpo_args=(--micro 256 --trl-micro 32 --hf-set actor_rollout_ref.rollout.free_cache_engine=false
             --hf-set actor_rollout_ref.rollout.gpu_memory_utilization=0.3)
  grpo_profile_micro=32
  grpo_profile_trace=--no-profile-trace
  bounds_args=(--copy-mb 2048 --gemm 8192)
  # Measured on an H200 (s): build 135, decode parity 5, bounds 5, models 22, decode 1.7B 37 + graphs ~35 +
  # peer 30, profiles 27 + 31, rollout 17 + graphs 15 + peer 34, GRPO 30 + TRL 53: ~510 of the first call's 530
  # (the 0.6B decode cells after them run only if the others were faster). The second call: test_cuda_parity
  # ~20, train ~60 (cut at 35 s in the first call before verl's update), the GRPO update's profile ~50
  # (estimated: three steps and the trace), the training profile ~40, test_batch_invariant_cuda ~30, decode 0.6B
  # ~3 x 25 where time is left.
  limit_build=300 limit_models=60 limit_decode=75 limit_profile=60 limit_train=90 limit_grpo=90
  limit_rollout=80 limit_decode_small=50 limit_tests=90
  [ "$part" = 1 ] || budget=${HF_BENCH_BUDGET_S:-240}
else
  budget=${HF_BENCH_BUDGET_S:-1500}
  [ "$part" = 1 ] || budget=${HF_BENCH_BUDGET_S:-900}
  build=${HF_BUILD_DIR:-build}
  python=${HF_PYTHON:-.venv/bin/python}
  device=cpu
  site=/tmp/hf-bench-site-smoke
  wheels=.cache/gpubench-wheels
  threads=$(nproc)
  big=tiny small=tiny
  decode_batches=1,4 decode_prompt=24 decode_new=6 decode_reps=1
  profile_batches=1,4 profile_steps=2
  rollout_prompt=16 rollout_prompts=4 rollout_samples=2 rollout_new=24 rollout_stop=16 rollout_seqs=8 rollout_shared=32
  train_args=(--batch 2 --prompt-length 16 --response-length 16 --steps 1 --rl-rows 4 --micro-rows 2 --stop-every 8)
  grpo_prompts=2 grpo_group=2 grpo_new=8 grpo_steps=2
  grpo_args=(--micro 4 --trl-micro 2 --hf-set actor_rollout_ref.rollout.free_cache_engine=false)
  grpo_profile_micro=2
  grpo_profile_trace=--profile-trace
  bounds_args=(--copy-mb 64 --gemm 512)
  limit_build=60 limit_models=90 limit_decode=120 limit_profile=120 limit_train=120 limit_grpo=400
  limit_rollout=120 limit_decode_small=120 limit_tests=300
fi
hf=$build/hybridflow
decode_context=$((decode_prompt + decode_new / 2))  # the prompt and, on average, half the new tokens
decode_args=(--batch $decode_batches --prompt-length $decode_prompt --response-length $decode_new --reps $decode_reps)
decode_one_args=(--batch 1 --prompt-length $decode_prompt --response-length $decode_new --reps $decode_reps)
peer_decode_args=(--batch $decode_batches --prompt-length $decode_prompt --new-tokens $decode_new --reps $decode_reps)
profile_args=(--batch $profile_batches --prompt-length $decode_prompt --profile-steps $profile_steps)
rollout_args=(--rollout-prompts $rollout_prompts --samples $rollout_samples --prompt-length $rollout_prompt
              --response-length $rollout_new --stop-every $rollout_stop --max-num-seqs $rollout_seqs)
peer_rollout_args=(--prompts $rollout_prompts --samples $rollout_samples --prompt-length $rollout_prompt
                   --max-new-tokens $rollout_new --stop-every $rollout_stop)
grpo_args+=(--prompts $grpo_prompts --group $grpo_group --response-length $grpo_new --steps $grpo_steps --warmup 1)
# Extra flags for every hybridflow `bench generate` cell, and an optional variant of the decode, profile and
# rollout cells (see the header): word-split, as on a command line.
read -r -a generate_flags <<< "${HF_BENCH_GENERATE_FLAGS:-}"
# On a GPU the variant is CUDA-graph decode read back every 8 steps (no host synchronisation in between)
# unless the caller names another (HF_BENCH_VARIANT_FLAGS= for none): neither has run on a GPU before, so the
# eager cells, read back every step, stay the baseline beside them.
if [ "$mode" = gpu ] && [ -z "${HF_BENCH_VARIANT_FLAGS+set}" ]; then
  HF_BENCH_VARIANT_FLAGS="--cuda-graphs --readback-interval 8" HF_BENCH_VARIANT_NAME=${HF_BENCH_VARIANT_NAME:-graphs}
fi
read -r -a variant_flags <<< "${HF_BENCH_VARIANT_FLAGS:-}"
variant=${HF_BENCH_VARIANT_NAME:-variant}
sizes="decode: ${decode_prompt}-token prompts + ${decode_new} new tokens at batch ${decode_batches//,/, } (decode tokens/s ="
sizes+=" batch x $((decode_new - 1)) / (the run of ${decode_new} new tokens less the run of 1; with CUDA graphs x $((decode_new - 2)), less"
sizes+=" the run of 2, which holds the capture), prefill apart; the fastest of"
sizes+=" ${decode_reps} on both sides); profile: ${profile_steps} decode steps at batch ${profile_batches//,/, } (same"
sizes+=" prompts); rollout: ${rollout_prompts} prompts x ${rollout_samples} samples, prompts of $((rollout_prompt / 2))..${rollout_prompt}"
sizes+=" tokens, up to ${rollout_new} new tokens, a stop token each step with p = 1/${rollout_stop},"
sizes+=" hybridflow with ${rollout_seqs} sequences at once; GRPO: ${grpo_prompts} prompts x ${grpo_group}, responses up to"
sizes+=" ${grpo_new} tokens, ${grpo_steps} steps of which the first is a warm-up (${grpo_args[*]}; the profile cell:"
sizes+=" --micro ${grpo_profile_micro}, 4 steps, the fourth profiled); train: ${train_args[*]}."
title="hybridflow on $([ "$mode" = gpu ] && (nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1) || echo "the CPU (smoke run, tiny shapes: the ratios mean nothing)"), bf16"
peers=(bench/gpu_peers.py --device "$device")
deadline=$((start + budget))
status=$work/status.txt
status_first=$work/status-first-call.txt
if [ "$part" = 1 ]; then
  : > "$status"
  rm -f "$status_first"
else
  # The first call's statuses, kept apart from the lines this call appends after them.
  [ -f "$status_first" ] || { [ -f "$status" ] && cp "$status" "$status_first"; }
  touch "$status"
fi
# Cells that run only in the second call, and those the second call runs when no first call left a status.
second_call_only="|train $big|profile grpo $small|profile $big $variant attn-v2|decode $big $variant gemv|profile $big $variant gemv|rollout $small $variant admit-each|rollout $small $variant shared-prefix|"
usually_left="|bounds|train $big|profile grpo $small|decode $small|decode $small $variant|decode $small peer|profile train $big|"

# wanted NAME: whether this call runs the cell. The first runs all but second_call_only; the second those the
# first skipped, stopped at their limit, left to it or never reached (none that ran to the end or failed).
wanted() {
  local name=$1
  [ "$part" = 1 ] && { [[ "$second_call_only" != *"|$name|"* ]]; return; }
  [ "${always:-0}" = 1 ] && return 0
  if [ ! -s "$status_first" ]; then
    [[ "$usually_left" == *"|$name|"* ]]
    return
  fi
  local was
  was=$(awk -F'|' -v n="$name" '$1 == n {s = $2} END {print s}' "$status_first")
  case $was in
    "" | skipped* | stopped* | "in the second call"*) return 0 ;;
    *) return 1 ;;
  esac
}

# cell NAME LIMIT COMMAND...: runs one measurement within min(LIMIT, the time left), its output appended to the
# log; its JSON lines go to results.jsonl, tagged with the cell's name. A cell that fails or runs out of time is
# recorded as such and the next one runs.
cell() {
  local name=$1 limit=$2; shift 2
  local call=""
  [ "$part" = 1 ] || call=" (second call)"
  if ! wanted "$name"; then
    if [ "$part" = 1 ]; then
      echo "$name|in the second call (--rest)|0" >> "$status"
      echo "== $name: in the second call (--rest)" | tee -a "$log"
    fi
    return 0
  fi
  local left=$((deadline - SECONDS - 5))
  if [ "$left" -lt 15 ]; then
    echo "$name|skipped: no time left$call|0" >> "$status"
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
  what+=$call
  echo "$name|$what|$took" >> "$status"
  echo "-- $name: $what in ${took} s" | tee -a "$log"
  return $rc
}

# always_cell NAME LIMIT COMMAND...: a cell this call runs whatever the first call did.
always_cell() { always=1 cell "$@"; }

table() {
  cp "$results" "$out/results.jsonl"
  "$python" bench/gpu_bench_table.py --results "$out/results.jsonl" --status "$status" --models "$work" \
    --out "$out/table.md" --decode-context "$decode_context" --title "$title" --sizes "$sizes"
}

{
  echo "gpu_bench ($mode, $([ "$part" = 1 ] && echo "first call" || echo "second call: --rest")), $(date -u +%FT%TZ), budget ${budget} s"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())'
} 2>&1 | tee -a "$log"

# The peers' missing packages (TRL and datasets' own needs), from carried wheels, beside the image's.
# The second call reuses the first's install where the machine kept it.
if ls "$wheels"/*.whl >/dev/null 2>&1; then
  if [ "$part" = 1 ] || [ ! -d "$site/trl" ]; then
    rm -rf "$site"
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheels"/*.whl 2>&1 | tail -n 3
  fi
  export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
fi
"$python" -c 'import trl, datasets; print("trl", trl.__version__, "datasets", datasets.__version__)' 2>&1 | tail -n 1 | tee -a "$log"

# The second call builds only what the first left no binary of (a machine that went cold in between).
build_cell=cell
[ "$part" = 2 ] && build_cell=always_cell
if [ "$mode" = gpu ] && [ "${HF_BENCH_SKIP_BUILD:-0}" != 1 ] &&
   { [ "$part" = 1 ] || [ ! -x "$hf" ] || [ ! -x "$build/test_cuda_parity" ]; }; then
  $build_cell build "$limit_build" env HF_BUILD_DIR="$build" HF_PYTHON="$python" bash scripts/gpu_build.sh hybridflow \
    test_cuda_parity test_batch_invariant_cuda ||
    { table; exit 1; }
fi
[ -f "$build/hf-env.sh" ] && source "$build/hf-env.sh"
[ -x "$hf" ] || { echo "gpu_bench: $hf not found" | tee -a "$log"; exit 1; }
# Before any decode cell: do captured decode steps choose the eager steps' tokens on this GPU (fp32 and bf16), and
# do the fused decode kernels (every hybridflow decode cell uses them; HF_DECODE_KERNELS=off runs the gather path
# instead) compute what the unfused operators do?
[ "$part" = 1 ] && [ "$mode" = gpu ] && [ -x "$build/test_cuda_parity" ] &&
  cell "decode parity" 60 "$build/test_cuda_parity" --gtest_filter='*DecodeGraphs*:*DecodeKernels*:*ChunkedReadBack*'
# The second call: every GPU parity test first (the CUDA-graph default among them); on the CPU they skip.
[ "$part" = 2 ] && [ -x "$build/test_cuda_parity" ] &&
  always_cell "cuda parity (all tests)" "$limit_tests" "$build/test_cuda_parity"

cell bounds 60 "$python" "${peers[@]}" bounds "${bounds_args[@]}"
tokenizer=.gpudeps/tokenizer
shapes=() missing_model=0
for shape in $(printf '%s\n' $big $small | sort -u); do
  shapes+=(--shape "$shape")
  ls "$work/$shape"/*.safetensors >/dev/null 2>&1 && [ -f "$work/$shape/config.json" ] || missing_model=1
done
# The second call reuses the first's models (the machine kept /tmp), making them only where they are missing.
if [ "$part" = 1 ] || [ "$missing_model" = 1 ]; then
  always_cell models "$limit_models" "$python" "${peers[@]}" make-model "${shapes[@]}" --out "$work" --tokenizer "$tokenizer"
fi
common=(--device "$device" --dtype bf16 --threads "$threads" --json)
generate=("$hf" bench generate "${common[@]}")

# decode_cells SHAPE LIMIT: hybridflow (and its variant) and transformers on the decode cell.
decode_cells() {
  local shape=$1 limit=$2
  local run=("${generate[@]}" --model "$work/$shape" "${decode_args[@]}" --rollout-prompts 1 --samples 1 --no-static-baseline)
  cell "decode $shape" "$limit" "${run[@]}" "${generate_flags[@]}"
  [ ${#variant_flags[@]} = 0 ] || cell "decode $shape $variant" "$limit" "${run[@]}" "${generate_flags[@]}" "${variant_flags[@]}"
  # The second paged-attention kernels (opt-in until measured): the variant's run again with them, beside it.
  [ "$shape" != "$big" ] || cell "decode $shape $variant attn-v2" "$limit" env HF_PAGED_ATTENTION=v2 "${run[@]}" \
    "${generate_flags[@]}" "${variant_flags[@]}"
  cell "decode $shape peer" "$limit" "$python" "${peers[@]}" hf-decode --model "$work/$shape" "${peer_decode_args[@]}"
}

# profile_cell NAME COMMAND...: a profile (`--profile` is added), the traces gzipped into OUT (the device call
# returns few files of at most 16 MiB: a larger one is dropped, and the log says so).
profile_cell() {
  local name=$1; shift
  local trace=$out/${name// /-}.json
  cell "$name" "$limit_profile" "$@" --profile "$trace"
  local f
  for f in "$trace" "${trace%.json}".batch*.json; do
    [ -f "$f" ] || continue
    gzip -f "$f"
    if [ "$(stat -c %s "$f.gz")" -gt $((15 * 1024 * 1024)) ]; then
      echo "gpu_bench: $f.gz is over 15 MiB: not kept (fewer --profile-steps keep it smaller)" | tee -a "$log"
      rm -f "$f.gz"
    fi
  done
}

decode_cells "$big" "$limit_decode"
table
profile=("${generate[@]}" --model "$work/$big" "${profile_args[@]}" "${generate_flags[@]}")
profile_cell "profile $big" "${profile[@]}"
[ ${#variant_flags[@]} = 0 ] || profile_cell "profile $big $variant" "${profile[@]}" "${variant_flags[@]}"
profile_cell "profile $big $variant attn-v2" env HF_PAGED_ATTENTION=v2 "${profile[@]}" "${variant_flags[@]}"
table
rollout=("${generate[@]}" --model "$work/$small" --rollout-only --no-static-baseline "${rollout_args[@]}")
# The variant's rollout (on a GPU, CUDA graphs) also times the next rollout on the pools and graphs the first
# kept (--kept-pools: free_cache_engine false), as does the CPU smoke run's rollout, which has no variant.
kept=()
[ ${#variant_flags[@]} != 0 ] || [ "$mode" = gpu ] || kept=(--kept-pools)
cell "rollout $small" "$limit_rollout" "${rollout[@]}" "${generate_flags[@]}" "${kept[@]}"
[ ${#variant_flags[@]} = 0 ] || cell "rollout $small $variant" "$limit_rollout" "${rollout[@]}" "${generate_flags[@]}" "${variant_flags[@]}" --kept-pools
cell "rollout $small peer" "$limit_rollout" "$python" "${peers[@]}" hf-rollout --model "$work/$small" "${peer_rollout_args[@]}"
table
# The two sides in cells of their own (the same prompts, drawn from one seed): each gets its own time.
grpo=("$python" bench/grpo_vs_trl.py --hybridflow "$hf" --model "$work/$small" --device "$device" --dtype bf16
      --threads "$threads" --no-cpu-time "${grpo_args[@]}")
cell "grpo $small" "$limit_grpo" "${grpo[@]}" --sides dynamic --out "$work/grpo"
cell "grpo $small peer" "$limit_grpo" "${grpo[@]}" --sides trl --out "$work/grpo_trl"
table
# The training cell runs in the second call (second_call_only): the first call's budget left it 35 s of the
# ~60 it needs to reach verl's update.
cell "train $big" "$limit_train" "$hf" bench train "${common[@]}" --model "$work/$big" "${train_args[@]}"
# The GRPO step's update under the profiler (global_profiler, from the trainer itself): its fourth step's old
# log-probs and update at ${grpo_profile_micro} rows a micro-batch, with the update's phases (forward, backward,
# master accumulation, clip, AdamW) in device time; of the three timed steps the median is one not profiled. The summaries go to results.jsonl (the cell's JSON lines). On a GPU without the traces: the
# update's eight micro-batches make about a million events, hundreds of MB that would take the cell's time to
# write and could not come back (the device call returns files of at most 16 MiB); the smoke run writes them
# and keeps the update's, gzipped, in OUT.
cell "profile grpo $small" "$limit_grpo" "${grpo[@]}" --sides dynamic --micro "$grpo_profile_micro" --steps 4 \
  --warmup 1 --profile-step 4 "$grpo_profile_trace" --out "$work/grpo_profile"
for f in "$work"/grpo_profile/hybridflow_*/profile/step_4/*_update_actor_1.trace.json; do
  [ -f "$f" ] || continue
  gzip -c "$f" > "$out/grpo-profile-update.trace.json.gz"
  [ "$(stat -c %s "$out/grpo-profile-update.trace.json.gz")" -le $((15 * 1024 * 1024)) ] ||
    { echo "gpu_bench: the GRPO update's trace is over 15 MiB gzipped: not kept" | tee -a "$log";
      rm -f "$out/grpo-profile-update.trace.json.gz"; }
done
# Where time is left: one training step at 1.7B under the profiler (the training cell's shape).
profile_cell "profile train $big" "$hf" bench train "${common[@]}" --model "$work/$big" "${train_args[@]}"
# The second call, after the training cells: the opt-in few-rows projection kernels (HF_DECODE_GEMV=on, steps of
# at most 8 rows) on the variant's batch-1 decode and its profile, and the rollout with prompts joining one at a
# time as places free up (--admission-rows 0, the behaviour before admission_rows), each beside its cell above.
cell "decode $big $variant gemv" "$limit_decode" env HF_DECODE_GEMV=on "${generate[@]}" --model "$work/$big" \
  "${decode_one_args[@]}" --rollout-prompts 1 --samples 1 --no-static-baseline "${generate_flags[@]}" "${variant_flags[@]}"
profile_cell "profile $big $variant gemv" env HF_DECODE_GEMV=on "${generate[@]}" --model "$work/$big" --batch 1 \
  --prompt-length $decode_prompt --profile-steps $profile_steps "${generate_flags[@]}" "${variant_flags[@]}"
cell "rollout $small $variant admit-each" "$limit_rollout" "${rollout[@]}" "${generate_flags[@]}" "${variant_flags[@]}" \
  --admission-rows 0
# The batch-invariant mode's cost where time is left: rollout tokens/s with rollout.batch_invariant on and off
# (fp32, a 4-layer decoder of hidden 512, 64 rows; its JSON line lands in results.jsonl, not in the table).
[ "$part" = 1 ] && [ "$mode" = gpu ] && [ -x "$build/test_batch_invariant_cuda" ] &&
  cell "batch-invariant cost" 60 "$build/test_batch_invariant_cuda" --gtest_filter='BatchInvariantCudaCost.*'
# The second call: every batch-invariant test on the GPU (never run there in full), the cost cell's test among
# them (its JSON line too), before the 0.6B decode cells, which repeat the 1.7B ones at a smaller shape.
[ "$part" = 2 ] && [ -x "$build/test_batch_invariant_cuda" ] &&
  always_cell "batch-invariant (all tests, the cost among them)" "$limit_tests" "$build/test_batch_invariant_cuda"
# Prefix caching in the rollout (the second call, where time is left): the rollout cell's prompts each after the
# same ${rollout_shared} ids, timed with prefix caching off and on in one run (two rollouts).
cell "rollout $small $variant shared-prefix" "$limit_rollout" "${rollout[@]}" "${generate_flags[@]}" "${variant_flags[@]}" \
  --shared-prefix "$rollout_shared"
[ "$small" = "$big" ] || decode_cells "$small" "$limit_decode_small"
echo "gpu_bench: $((SECONDS - start)) s in all" | tee -a "$log"
table
