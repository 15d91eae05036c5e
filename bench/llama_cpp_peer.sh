#!/usr/bin/env bash
# The llama.cpp peer on the CPU: hybridflow's decode and prefill against llama.cpp's on the same random-weight
# model (the qwen2.5-0.5b preset: 494 M parameters, hidden 896, 24 layers, 14 / 2 heads, vocabulary 151,936,
# tied head), fp32 weights on both sides, the same threads, prompt length, new tokens and batches, the two
# sides alternated in rounds (a shared machine's load then hits both alike), ratios per round and medians.
#
# Nothing is downloaded or built here. You bring llama.cpp yourself: its source tree (for its
# convert_hf_to_gguf.py and gguf-py) and a CPU build of its llama-batched-bench tool made as its own
# documentation describes; and a built build/hybridflow (bash scripts/build.sh hybridflow).
#
#   bash bench/llama_cpp_peer.sh LLAMA_CPP_SOURCE_DIR [LLAMA_CPP_BIN_DIR]
#
# LLAMA_CPP_BIN_DIR defaults to SOURCE/build/bin. Environment (defaults in brackets): ROUNDS [3],
# BATCHES [1,8,32], PROMPT [32], NEW_TOKENS [64], THREADS [2], HF_REPS [1: hybridflow's timed runs per
# figure, the fastest counting; llama-batched-bench times one], WORK [/tmp/hybridflow-llama-cpp-peer: the model
# directory and its GGUF, kept between runs], HF_BIN [build/hybridflow], PYTHON [.venv/bin/python: it needs
# torch, transformers, numpy, pyyaml, tqdm], TOKENIZER [../shared/testdata/tokenizers/qwen3: a directory with
# the published Qwen tokenizer.json], LLAMA_EXTRA [extra llama-batched-bench arguments, e.g. "--poll 0"].
#
# What is matched: weights (one safetensors file, converted to an F32 GGUF), fp32 KV cache on both sides
# (-ctk f32 -ctv f32), threads (-t / -tb and --threads), prompt length, new tokens, batches (llama.cpp's
# parallel sequences, each with its own prompt, decoded together each step), random prompt tokens.
# What is not (docs/performance.md#the-llamacpp-peer): llama.cpp times NEW_TOKENS decode steps that compute
# logits and sample nothing; hybridflow times NEW_TOKENS - 1 steps (its first token comes from the prefill)
# and samples every row from the full vocabulary each step.
set -euo pipefail
cd "$(dirname "$0")/.."
# Both sides run OpenMP teams (ggml's CPU backend is built with OpenMP by default): threads that wait at a
# barrier sleep instead of spinning, or on a loaded machine a spinning thread holds the core that the thread
# it waits for needs (llama.cpp's batch-1 decode ran 2-5x slower so at a load of 4-5 on 2 cores).
export OMP_WAIT_POLICY=passive

src=${1:?usage: bash bench/llama_cpp_peer.sh LLAMA_CPP_SOURCE_DIR [LLAMA_CPP_BIN_DIR]}
bin=${2:-$src/build/bin}
rounds=${ROUNDS:-3}
batches=${BATCHES:-1,8,32}
prompt=${PROMPT:-32}
new_tokens=${NEW_TOKENS:-64}
threads=${THREADS:-2}
hf_reps=${HF_REPS:-1}
work=${WORK:-/tmp/hybridflow-llama-cpp-peer}
hf_bin=${HF_BIN:-build/hybridflow}
python=${PYTHON:-.venv/bin/python}
tokenizer=${TOKENIZER:-../shared/testdata/tokenizers/qwen3}

fail() { echo "llama_cpp_peer.sh: $*" >&2; exit 1; }
[ -f "$src/convert_hf_to_gguf.py" ] || fail "$src has no convert_hf_to_gguf.py: give the llama.cpp source directory"
[ -d "$src/gguf-py" ] || fail "$src has no gguf-py directory: give the llama.cpp source directory"
[ -x "$bin/llama-batched-bench" ] || fail "no $bin/llama-batched-bench: build llama.cpp's llama-batched-bench (CPU) or give its directory"
[ -x "$hf_bin" ] || fail "no $hf_bin: build it first (bash scripts/build.sh hybridflow) or set HF_BIN"
[ -x "$python" ] || fail "no $python: set PYTHON to a Python with torch and transformers"
[ -f "$tokenizer/tokenizer.json" ] || fail "no $tokenizer/tokenizer.json: set TOKENIZER to a directory with a Qwen tokenizer.json"

mkdir -p "$work"
model="$work/qwen2.5-0.5b"
gguf="$work/qwen2.5-0.5b-f32.gguf"
if [ ! -f "$model/model.safetensors" ]; then
  echo "== making the model: hybridflow init --preset qwen2.5-0.5b (random weights, fp32)"
  "$hf_bin" init --preset qwen2.5-0.5b --tokenizer "$tokenizer" --out "$model"
fi
if [ ! -f "$gguf" ]; then
  echo "== converting it to an F32 GGUF with llama.cpp's convert_hf_to_gguf.py"
  pythonpath="$src/gguf-py"
  if ! "$python" -c 'import sentencepiece' 2>/dev/null; then
    # The converter imports sentencepiece before it looks for a tokenizer.model, which a Qwen (byte-level
    # BPE) directory does not have; a stand-in lets it fall through to its BPE path, which is what it uses.
    mkdir -p "$work/pyshim/sentencepiece"
    echo 'class SentencePieceProcessor: pass' > "$work/pyshim/sentencepiece/__init__.py"
    pythonpath="$pythonpath:$work/pyshim"
  fi
  PYTHONPATH="$pythonpath" "$python" "$src/convert_hf_to_gguf.py" "$model" --outtype f32 --outfile "$gguf.part" \
    > "$work/convert.log" 2>&1 || { tail -20 "$work/convert.log" >&2; fail "conversion failed (log: $work/convert.log)"; }
  mv "$gguf.part" "$gguf"
fi

max_batch=$(tr ',' '\n' <<< "$batches" | sort -n | tail -1)
ctx=$(( max_batch * (prompt + new_tokens) ))
results="$work/results.jsonl"
: > "$results"

run_hybridflow() {
  local round=$1 load
  load=$(cut -d' ' -f1 /proc/loadavg)
  echo "== round $round: hybridflow (load average $load)"
  "$hf_bin" bench generate --model "$model" --threads "$threads" --batch "$batches" \
    --prompt-length "$prompt" --response-length "$new_tokens" --reps "$hf_reps" --rollout-prompts 1 --samples 1 \
    --no-static-baseline --json > "$work/hybridflow.$round.jsonl"
  "$python" - "$work/hybridflow.$round.jsonl" "$round" "$load" >> "$results" <<'EOF'
import json, sys
path, rnd, load = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
for line in open(path):
    if not line.startswith("{"):
        continue
    m = json.loads(line)
    if m["what"] in ("decode", "prefill"):
        print(json.dumps({"side": "hybridflow", "round": rnd, "what": m["what"], "batch": m["batch"],
                          "tokens_per_s": m["tokens_per_s"], "load": load}))
EOF
}

run_llama_cpp() {
  local round=$1 load
  load=$(cut -d' ' -f1 /proc/loadavg)
  echo "== round $round: llama.cpp (load average $load)"
  # shellcheck disable=SC2086  # LLAMA_EXTRA is a list of arguments
  "$bin/llama-batched-bench" -m "$gguf" -c "$ctx" -npp "$prompt" -ntg "$new_tokens" -npl "$batches" \
    -t "$threads" -tb "$threads" -ctk f32 -ctv f32 --output-format jsonl ${LLAMA_EXTRA:-} \
    > "$work/llama_cpp.$round.jsonl" 2> "$work/llama_cpp.$round.log" \
    || { tail -20 "$work/llama_cpp.$round.log" >&2; fail "llama-batched-bench failed"; }
  "$python" - "$work/llama_cpp.$round.jsonl" "$round" "$load" "$max_batch" >> "$results" <<'EOF'
import json, sys
path, rnd, load, top = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
for line in open(path):
    if not line.startswith("{"):
        continue
    m = json.loads(line)
    print(json.dumps({"side": "llama.cpp", "round": rnd, "what": "decode", "batch": m["pl"],
                      "tokens_per_s": m["speed_tg"], "load": load}))
    if m["pl"] == top:
        print(json.dumps({"side": "llama.cpp", "round": rnd, "what": "prefill", "batch": m["pl"],
                          "tokens_per_s": m["speed_pp"], "load": load}))
EOF
}

echo "model: $model ($gguf), threads $threads, prompt $prompt, new tokens $new_tokens, batches $batches, rounds $rounds"
for round in $(seq 1 "$rounds"); do
  if (( round % 2 == 1 )); then run_hybridflow "$round"; run_llama_cpp "$round"
  else run_llama_cpp "$round"; run_hybridflow "$round"; fi
done

"$python" - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cells = sorted({(r["what"], r["batch"]) for r in rows}, key=lambda c: (c[0] != "decode", c[1]))
rounds = sorted({r["round"] for r in rows})
get = {(r["side"], r["round"], r["what"], r["batch"]): r["tokens_per_s"] for r in rows}
print()
print("| what | batch | hybridflow tokens/s (per round) | llama.cpp tokens/s (per round) | ratio per round | median ratio |")
print("|---|---|---|---|---|---|")
for what, batch in cells:
    hf = [get.get(("hybridflow", r, what, batch)) for r in rounds]
    lc = [get.get(("llama.cpp", r, what, batch)) for r in rounds]
    ratios = [h / l for h, l in zip(hf, lc) if h and l]
    fmt = lambda xs: " / ".join("-" if x is None else f"{x:.1f}" for x in xs)
    med = f"{statistics.median(ratios):.2f}x" if ratios else "-"
    print(f"| {what} | {batch} | {fmt(hf)} | {fmt(lc)} | {' / '.join(f'{x:.2f}' for x in ratios)} | {med} |")
loads = {}
for r in rows:
    loads.setdefault(r["side"], []).append(r["load"])
print()
print("load average at the start of each run: " +
      "; ".join(f"{s} {min(v):.2f}-{max(v):.2f}" for s, v in sorted(loads.items())))
EOF
