#!/usr/bin/env bash
# Runs a command in this checkout as if the checkout were at CI's fixed workspace path
# (~/.cache/hybridflow/ci-workspace/main, see .ci/run), in a private mount namespace (needs root).
#
#   bash scripts/at_ci_path.sh bash scripts/build.sh        # build here; ccache files the objects under CI's path
#   bash scripts/at_ci_path.sh ctest --test-dir build -R core
#
# Why: the precompiled libtorch header records absolute paths, so ccache reuses an object only for a checkout
# at the same path. Building every checkout (a developer's, a second worktree, CI's fresh clone) at that one
# path lets all of them share the compiled objects: CI after a session finds what the session compiled.
# The build tree and .venv stay inside this checkout; inside the namespace they appear under CI's path, so a
# build directory made this way must always be used this way. Builds take a lock (one at a time on a small
# machine) when HF_BUILD_LOCK names a file. Never run .ci/run through this script: it deletes CI's path.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: bash scripts/at_ci_path.sh COMMAND [ARGS...]" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "at_ci_path: needs root (a private mount namespace)" >&2; exit 2; }
checkout=$(cd "$(dirname "$0")/.." && pwd)
ci_path=${HF_CI_WORKSPACE:-${XDG_CACHE_HOME:-$HOME/.cache}/hybridflow/ci-workspace}/main
mkdir -p "$ci_path"
run=(unshare -m bash -c 'set -e; mount --make-rprivate /; mount --rbind "$1" "$2"; cd "$2"; shift 2; exec "$@"'
     at_ci_path "$checkout" "$ci_path" "$@")
if [ -n "${HF_BUILD_LOCK:-}" ]; then exec flock "$HF_BUILD_LOCK" "${run[@]}"; fi
exec "${run[@]}"
