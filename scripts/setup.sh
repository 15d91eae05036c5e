#!/usr/bin/env bash
# Installs every Debian package hybridflow needs. Idempotent: safe to run again.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config ccache
  libtorch-dev             # tensors, autograd, c10d (CPU build, 1.13)
  libopenblas0-openmp      # fast BLAS; without it libtorch uses the reference BLAS (~25x slower)
  libgloo-dev              # headers needed by c10d's ProcessGroupGloo
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libyaml-cpp-dev libcli11-dev
  libzmq3-dev cppzmq-dev   # controller <-> worker messages
  openmpi-bin libopenmpi-dev
  iproute2                 # network namespaces for the multi-host test
  python3                  # reward scorers written in Python (tests use one as an external command)
)

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# libtorch links libblas.so.3; make sure the alternative points at OpenBLAS, not the reference BLAS.
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
openblas=/usr/lib/$arch/openblas-openmp/libblas.so.3
if [ -e "$openblas" ]; then
  current=$(readlink -f /etc/alternatives/libblas.so.3-$arch 2>/dev/null || true)
  if [ "$current" != "$(readlink -f "$openblas")" ]; then
    "${sudo_cmd[@]}" update-alternatives --set "libblas.so.3-$arch" "$openblas"
  fi
fi
echo "setup: all packages present; BLAS -> $(readlink -f /etc/alternatives/libblas.so.3-$arch 2>/dev/null || echo unknown)"
