#!/usr/bin/env bash
# Configures and builds hybridflow into ./build (Release: -O2 without debug information; Ninja when available)
# against the libtorch of the project's virtual environment (.venv, made by scripts/setup.sh).
#   HF_BUILD_DIR=dir   build directory (default build)
#   HF_CUDA=1          the CUDA configuration (nvcc + CUDA-enabled libtorch); default build-cuda
#   HF_BUILD_JOBS=n    parallel compile jobs (default 2: each libtorch translation unit takes ~1.5 GB)
#   HF_BUILD_TYPE=t    CMake build type of a new build directory (default Release; RelWithDebInfo adds debug
#                      information to the same -O2 code: slower to build, a 500 MB binary)
# Extra arguments are build targets (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."
cuda=${HF_CUDA:-0}
if [ "$cuda" = 1 ]; then build_dir=${HF_BUILD_DIR:-build-cuda}; else build_dir=${HF_BUILD_DIR:-build}; fi
python=${HF_PYTHON:-.venv/bin/python}
if [ ! -x "$python" ]; then
  echo "build: $python not found; run scripts/setup.sh first (it makes .venv with PyTorch)" >&2
  exit 1
fi
torch_prefix=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  # Precompiled headers are cacheable only with these; a second build tree then reuses the first's objects.
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
  export CCACHE_NOHASHDIR=1 CCACHE_BASEDIR="$PWD"
  ccache --max-size=16G >/dev/null 2>&1 || true
fi
cuda_args=()
if [ "$cuda" = 1 ]; then
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  cuda_args=(-DHF_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" -DTORCH_CUDA_ARCH_LIST="8.0;9.0")
fi
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  cmake -S . -B "$build_dir" "${generator[@]}" "${launcher[@]}" "${cuda_args[@]}" -DCMAKE_BUILD_TYPE="${HF_BUILD_TYPE:-Release}" \
    -DCMAKE_PREFIX_PATH="$torch_prefix"
fi
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "$build_dir" -j "${HF_BUILD_JOBS:-2}" "${targets[@]}"
