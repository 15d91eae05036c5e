#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs every unit test through CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
export OMP_WAIT_POLICY=passive
ctest --test-dir "${HF_BUILD_DIR:-build}" --output-on-failure -j 2 "$@"
