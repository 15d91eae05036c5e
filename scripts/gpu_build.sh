#!/usr/bin/env bash
# Builds hybridflow on a GPU machine with no network and no apt (the lent H100 / H200: Ubuntu 24.04, g++ 13,
# CMake, ninja, nvcc 13.0, python3 with PyTorch): unpacks the .debs that scripts/gpu_deps.sh downloaded (carried
# in .gpudeps/) into a prefix under /tmp, never into /, and configures the CUDA build against that prefix and the
# libtorch of the machine's python3. Builds only the targets asked for (default: hybridflow).
#
#   bash scripts/gpu_build.sh [TARGET...]          # then: source build-cuda/hf-env.sh (the library path)
#   HF_BUILD_DIR=dir HF_BUILD_JOBS=16 HF_DEPS_PREFIX=/tmp/hf-deps HF_PYTHON=python3 bash scripts/gpu_build.sh
#   HF_CUDA=0 ...                                  # the CPU configuration through the same prefix
#   HF_DEPS_ISOLATE=1 ...                          # ignore /usr's packages (CMAKE_IGNORE_PREFIX_PATH=/usr): a test,
#                                                  # on a machine that has them, that the prefix alone suffices
set -euo pipefail
cd "$(dirname "$0")/.."
deps=${HF_DEPS_DIR:-.gpudeps}
prefix=${HF_DEPS_PREFIX:-/tmp/hf-deps}
cuda=${HF_CUDA:-1}
build=${HF_BUILD_DIR:-$([ "$cuda" = 1 ] && echo build-cuda || echo build-deps)}
python=${HF_PYTHON:-python3}
multiarch=lib/x86_64-linux-gnu
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(hybridflow)
ls "$deps"/debs/*.deb >/dev/null 2>&1 || { echo "gpu_build: no .debs in $deps/debs: run scripts/gpu_deps.sh where there is network, and carry $deps" >&2; exit 2; }
start=$SECONDS

# 1. The packages, unpacked beside the build. Their pkg-config files name /usr: point them at the prefix.
rm -rf "$prefix"
for deb in "$deps"/debs/*.deb; do dpkg -x "$deb" "$prefix"; done
for pc in "$prefix"/usr/$multiarch/pkgconfig/*.pc "$prefix"/usr/share/pkgconfig/*.pc; do
  sed -i -E "s#(=\"?)/usr#\1$prefix/usr#g" "$pc"
done
# The run-time library path holds only the libraries this machine lacks (by soname), so nothing the system
# already has (GSSAPI, say) is shadowed by Debian's copy for every process; HF_DEPS_ALL_LIBS=1 takes them all.
runlib=$prefix/runlib
mkdir -p "$runlib"
have=$(ldconfig -p 2>/dev/null | awk '{print $1}' | sort -u)
for lib in "$prefix"/usr/$multiarch/*.so.* "$prefix"/$multiarch/*.so.*; do
  [ -f "$lib" ] && [ ! -L "$lib" ] || continue
  soname=$(readelf -d "$lib" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
  [ -n "$soname" ] || continue
  if [ "${HF_DEPS_ALL_LIBS:-0}" = 1 ] || ! grep -qxF "$soname" <<<"$have"; then ln -sf "$lib" "$runlib/$soname"; fi
done
export LD_LIBRARY_PATH=$runlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG_LIBDIR=$prefix/usr/$multiarch/pkgconfig:$prefix/usr/share/pkgconfig
# Debian's pkgconf from the prefix (the image may have no pkg-config), the system's if that one does not run.
pkg_config=$prefix/usr/bin/pkgconf
"$pkg_config" --version >/dev/null 2>&1 || pkg_config=$(command -v pkg-config)
echo "gpu_build: $(ls "$deps"/debs/*.deb | wc -l) packages in $prefix; on the library path: $(ls "$runlib" | tr '\n' ' ')"

# 2. Configure. gloo's headers (c10d includes them) come from no target: -isystem for every compile.
torch_prefix=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
args=(-S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DHF_BUILD_BENCH=OFF
      "-DCMAKE_PREFIX_PATH=$torch_prefix;$prefix/usr" "-DCMAKE_CXX_FLAGS=-isystem $prefix/usr/include"
      "-DPKG_CONFIG_EXECUTABLE=$pkg_config")
command -v ninja >/dev/null && args+=(-G Ninja)
command -v ccache >/dev/null && args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
if [ "$cuda" = 1 ]; then
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  # Hopper only (sm_90): one architecture compiles in half the time of build.sh's 8.0;9.0.
  args+=(-DHF_CUDA=ON "-DCMAKE_CUDA_COMPILER=$nvcc" -DTORCH_CUDA_ARCH_LIST=9.0 -DCMAKE_CUDA_ARCHITECTURES=90)
fi
[ "${HF_DEPS_ISOLATE:-0}" = 1 ] && args+=(-DCMAKE_IGNORE_PREFIX_PATH=/usr)
rm -rf "$build"
mkdir -p "$build"
cmake "${args[@]}" > "$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
grep -E "hybridflow:|Found|Checking for module" "$build/configure.log" || true
# Where every dependency was found: each must be in the prefix (or the torch / pyarrow wheels).
grep -E "^(yaml-cpp|nlohmann_json|CLI11|cppzmq|GTest)_DIR|^(ONIG|UTF8PROC|SODIUM)_(INCLUDEDIR|LIBDIR):|^PKG_CONFIG_EXECUTABLE" \
  "$build/CMakeCache.txt" || true
cat > "$build/hf-env.sh" <<EOF
# Sourced before running this build's binaries: the libraries of $prefix that this machine lacks.
export LD_LIBRARY_PATH=$runlib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
EOF

# 3. Build.
build_targets=()
for t in "${targets[@]}"; do build_targets+=(--target "$t"); done
cmake --build "$build" -j "${HF_BUILD_JOBS:-$(nproc)}" "${build_targets[@]}"
for t in "${targets[@]}"; do
  [ -x "$build/$t" ] || continue
  missing=$(ldd "$build/$t" | grep "not found" || true)
  [ -z "$missing" ] || { echo "gpu_build: $build/$t misses libraries:"; echo "$missing"; exit 1; }
done
echo "gpu_build: ${targets[*]} built in $((SECONDS - start)) s ($build; source $build/hf-env.sh before running)"
