#!/usr/bin/env bash
# CI's packaging check (issue 17), `make package`: build the sdist and the wheel, check them,
# install the wheel into a fresh venv outside the source tree and smoke-test the installed
# package.
#   1. python -m build (sdist, then the wheel built from the sdist) and twine check;
#   2. scripts/check_wheel.py: every file git tracks under src/vlret is in the wheel and sdist;
#   3. a fresh venv in a temp folder: the pinned torch first ($TORCH, the Makefile's; pip never
#      resolves an unpinned torch, which would fetch CUDA wheels), then the wheel alone: the core
#      imports work without any extra, and a harness command names the extra it needs;
#   4. the wheel with the extras [train,vsl]: scripts/smoke_installed.sh (version, configs,
#      the quick demo, a short training run from a shipped config on a generated world).
# Environment: TORCH (default torch==2.13.0), PYTHON (creates the venv; default python3),
# BUILD_PYTHON (runs build, twine; default .venv/bin/python), KEEP=1 keeps the temp folder,
# TMPDIR (where it goes; default /dev/shm when it has 4 GiB free, else /tmp).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
TORCH=${TORCH:-torch==2.13.0}
PYTHON=${PYTHON:-python3}
BUILD_PYTHON=${BUILD_PYTHON:-.venv/bin/python}

# The venv (torch: ~30000 files, 1.2 GB) on a RAM disk when one has room: on a slow disk,
# writing and deleting it takes minutes. TMPDIR, when set, decides.
base=${TMPDIR:-/tmp}
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ] \
  && [ "$(df -Pk /dev/shm | awk 'NR == 2 {print $4}')" -gt $((4 * 1024 * 1024)) ]; then
  base=/dev/shm
fi
work=$(mktemp -d "$base/vlret-package.XXXXXX")
export TMPDIR=$work/tmp  # pip's unpacking too
mkdir "$TMPDIR"
if [ "${KEEP:-0}" = 1 ]; then
  trap 'echo "package: kept $work"' EXIT
else
  trap 'rm -rf "$work"' EXIT
fi
start=$SECONDS
step() { echo "== package [$((SECONDS - start)) s]: $*"; }

step "build sdist and wheel"
"$BUILD_PYTHON" -m build --outdir "$work/dist" . >"$work/build.log" 2>&1 || {
  tail -40 "$work/build.log" >&2
  echo "package: python -m build failed" >&2
  exit 1
}
wheel=$(ls "$work"/dist/*.whl)
sdist=$(ls "$work"/dist/*.tar.gz)
echo "built $(basename "$sdist") and $(basename "$wheel")"

step "twine check"
"$BUILD_PYTHON" -m twine check --strict "$work"/dist/*

step "the wheel holds every tracked file"
"$BUILD_PYTHON" scripts/check_wheel.py "$wheel" --sdist "$sdist" --repo "$repo"

step "fresh venv in $work (outside the source tree), $TORCH first"
"$PYTHON" -m venv "$work/venv"
py=$work/venv/bin/python
# --no-compile: pip byte-compiles nothing (torch alone is ~3000 modules); Python compiles what
# the smoke test imports. The torch pin is a constraint for every install below: the wheel's loose torch>=2.1 can never
# make pip pick another torch.
printf '%s\n' "$TORCH" >"$work/constraints.txt"
"$py" -m pip install --quiet --no-compile -c "$work/constraints.txt" "$TORCH"

step "the wheel without extras: the core"
"$py" -m pip install --quiet --no-compile -c "$work/constraints.txt" "$wheel"
(cd "$work" && bash "$repo/scripts/smoke_installed.sh" core "$work/venv" "$repo")

step "the wheel with [train,vsl]"
"$py" -m pip install --quiet --no-compile -c "$work/constraints.txt" "$wheel[train,vsl]"
(cd "$work" && bash "$repo/scripts/smoke_installed.sh" full "$work/venv" "$repo")

step "done"
echo "package: OK in $((SECONDS - start)) s"
