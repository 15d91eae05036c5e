#!/usr/bin/env bash
# Builds and runs every benchmark in bench/. Each prints its figures (and a ratio against a baseline
# measured in the same run); none of them is a test.
#   HF_BENCH=bench_tokenizer   build and run that benchmark only (bench_tokenizer needs no libtorch:
#                              it compares text::Tokenizer with the Python tokenizers library)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_WAIT_POLICY=passive
build_dir=${HF_BUILD_DIR:-build}
if [ -n "${HF_BENCH:-}" ]; then
  bash scripts/build.sh "$HF_BENCH"
  echo "== $HF_BENCH"
  exec "$build_dir/$HF_BENCH" "$@"
fi
bash scripts/build.sh
for b in "$build_dir"/bench_*; do
  [ -x "$b" ] || continue
  echo "== $(basename "$b")"
  "$b" "$@"
done
# The product's own benchmark (docs/performance.md): every figure with its roofline ratio.
for what in machine generate train; do
  echo "== hybridflow bench $what"
  "$build_dir/hybridflow" bench "$what"
done
