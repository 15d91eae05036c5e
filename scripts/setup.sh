#!/usr/bin/env bash
# Installs everything hybridflow needs to build and test: Debian packages, then a project-local virtual
# environment (.venv) with PyTorch 2.x (the libtorch we compile against) and the Python test oracles from
# scripts/requirements.txt. Idempotent: safe to run again; a second run with nothing missing takes seconds.
#   --bench   also the peer benchmark's packages (TRL, scripts/requirements-bench.txt); never needed to build
#             or test
set -euo pipefail
cd "$(dirname "$0")/.."
with_bench=0
for arg in "$@"; do
  case "$arg" in
    --bench) with_bench=1 ;;
    *) echo "setup: unknown option $arg (expected --bench)" >&2; exit 2 ;;
  esac
done

packages=(
  build-essential cmake ninja-build pkg-config ccache
  python3 python3-venv     # .venv with PyTorch; reward scorers written in Python (tests use one)
  libgloo-dev              # headers of c10d's ProcessGroupGloo (the wheel ships the library, not these)
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libyaml-cpp-dev libcli11-dev
  libzmq3-dev cppzmq-dev   # controller <-> worker messages
  libsodium-dev            # key derivation and Poly1305 authenticating those messages
  libonig-dev libutf8proc-dev  # text layer: the tokenizers library's regex engine; Unicode normalisation
  openmpi-bin libopenmpi-dev
  iproute2                 # network namespaces for the multi-host test
  bubblewrap               # the sandbox of the built-in python tool (agentic rollouts)
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

# The virtual environment is rebuilt only when scripts/requirements.txt changed since it was made.
venv=${HF_VENV:-.venv}
stamp="$venv/.hybridflow-requirements"
if [ ! -x "$venv/bin/python" ] || ! cmp -s scripts/requirements.txt "$stamp"; then
  echo "setup: installing Python packages into $venv (PyTorch is ~1 GB to download, ~5 GB on disk)"
  [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -r scripts/requirements.txt
  cp scripts/requirements.txt "$stamp"
fi
if [ "$with_bench" = 1 ]; then
  bench_stamp="$venv/.hybridflow-bench-requirements"
  if ! cmp -s scripts/requirements-bench.txt "$bench_stamp"; then
    echo "setup: installing the peer benchmark's Python packages (TRL) into $venv"
    # The main requirements as constraints: TRL must not move torch or transformers under the build.
    "$venv/bin/python" -m pip install -q -r scripts/requirements-bench.txt -c scripts/requirements.txt
    cp scripts/requirements-bench.txt "$bench_stamp"
  fi
fi
echo "setup: ready; $("$venv/bin/python" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)')"
