#!/usr/bin/env bash
# Configures and builds hybridflow into ./build (Release with debug info, Ninja when available).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${HF_BUILD_DIR:-build}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  cmake -S . -B "$build_dir" "${generator[@]}" "${launcher[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
fi
# Each translation unit with libtorch takes ~1 GB of compiler memory; two at once fit any CI box.
cmake --build "$build_dir" -j "${HF_BUILD_JOBS:-2}"
