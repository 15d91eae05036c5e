#!/usr/bin/env bash
# Builds and runs every benchmark in bench/. Each prints its figures (and a ratio against a baseline
# measured in the same run); none of them is a test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
export OMP_WAIT_POLICY=passive
build_dir=${HF_BUILD_DIR:-build}
for b in "$build_dir"/bench_*; do
  [ -x "$b" ] || continue
  echo "== $(basename "$b")"
  "$b" "$@"
done
