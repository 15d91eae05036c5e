#!/usr/bin/env bash
# Downloads, on a machine with network, what the CUDA build and the GPU benchmark need on a GPU machine that has
# none (no network, no apt): Debian 12's .deb packages of the C++ dependencies (headers, CMake / pkg-config files
# and their runtime libraries) and the Python wheels of TRL and what it needs beyond that machine's image
# (PyTorch, transformers, accelerate, pandas, pyarrow are there). Everything lands in .gpudeps/ (git-ignored),
# which the device call carries; scripts/gpu_build.sh unpacks it there (never into /).
#
#   bash scripts/gpu_deps.sh            # .gpudeps/debs, .gpudeps/wheels, .gpudeps/tokenizer; prints the size
#   bash scripts/gpu_deps.sh --smoke    # also the wheels this machine's Python needs for gpu_bench.sh --cpu-smoke
#
# The GPU machine is Ubuntu 24.04 (glibc 2.39, GCC 13): Debian 12's libraries (glibc 2.36, GCC 12) run there.
set -euo pipefail
cd "$(dirname "$0")/.."
smoke=0
[ "${1:-}" = --smoke ] && smoke=1
out=.gpudeps
mkdir -p "$out/debs" "$out/wheels" "$out/tokenizer"

# Dev packages: headers and the CMake / pkg-config files CMakeLists.txt finds (find_package, pkg_check_modules),
# gloo's headers (c10d's ProcessGroupGloo.hpp includes them; the wheel ships none) and GoogleTest for the GPU
# check's test_cuda_parity; pkg-config itself (pkgconf), which the image may lack. Runtime libraries: what the binaries load, with libzmq5's own dependencies (norm,
# pgm, GSSAPI). scripts/gpu_build.sh puts on the library path only those the GPU machine lacks.
debs=(
  nlohmann-json3-dev libyaml-cpp-dev libcli11-dev cppzmq-dev libzmq3-dev libsodium-dev libonig-dev
  libutf8proc-dev libgloo-dev libgtest-dev libgmock-dev pkgconf pkgconf-bin libpkgconf3
  libyaml-cpp0.7 libzmq5 libsodium23 libonig5 libutf8proc2 libnorm1 libpgm-5.3-0
  libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1 libcom-err2
)
rm -f "$out"/debs/*.deb
(cd "$out/debs" && apt-get download "${debs[@]}")

# Wheels for the GPU machine's Python 3.12, no dependencies resolved (each one named): TRL, and datasets with the
# two packages of it that the image lacks. datasets 4.7 accepts the image's huggingface_hub 1.x and pyarrow >= 21.
pip_platform=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
              --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
wheels=(trl==1.16.0 datasets==4.7.0 dill==0.4.0 multiprocess==0.70.18)
rm -f "$out"/wheels/*.whl
python3 -m pip download -q --no-deps "${pip_platform[@]}" -d "$out/wheels" "${wheels[@]}"

# The published Qwen3 tokenizer for the model directories gpu_bench.sh writes (../shared does not travel).
for f in tokenizer.json tokenizer_config.json; do
  cp ../shared/testdata/tokenizers/qwen3/$f "$out/tokenizer/$f" 2>/dev/null ||
    cp /work/shared/testdata/tokenizers/qwen3/$f "$out/tokenizer/$f"
done

if [ "$smoke" = 1 ]; then
  # This machine's venv (Python 3.11, huggingface_hub 2.x) for the CPU smoke run: its own versions, under .cache.
  local_dir=.cache/gpubench-wheels
  rm -rf "$local_dir" && mkdir -p "$local_dir"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$local_dir" trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 accelerate==1.15.0 pandas psutil \
    xxhash requests urllib3 certifi idna charset-normalizer httpx httpcore h11 anyio sniffio python-dateutil pytz \
    tzdata six
  echo "smoke wheels: $(du -sh "$local_dir" | cut -f1) in $local_dir"
fi

ls "$out"/debs "$out"/wheels
size=$(du -sm "$out" | cut -f1)
echo "$out: ${size} MiB (the device call carries at most 64 MiB with the working tree)"
[ "$size" -lt 48 ] || { echo "gpu_deps: $out is over 48 MiB: too close to the carry limit" >&2; exit 1; }
