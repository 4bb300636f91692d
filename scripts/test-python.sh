#!/usr/bin/env bash
# The Python package's tests (python/), without PyTorch or a GPU: builds the abi3 wheel with
# maturin (dev profile, stripped: the workspace's compiled dependencies are reused), installs
# it into a fresh virtual environment with pytest and numpy, and runs python/tests there on
# the simulated device — the C ABI through ctypes, plan/replay against the gpumem binary,
# gpumem.torch/gpumem.cupy against stand-in modules.
# Arguments go to pytest. Environment: PYTHON (default python3, >= 3.10); GPUMEM_CLI (the
# gpumem binary to compare with; default target/debug/gpumem when cargo built it).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
build_venv="$repo/target/python-build-venv"
test_venv="$repo/target/python-test-venv"
wheels="$repo/target/python-wheel"  # this script's own: maturin's pip builds use target/wheels
say() { echo "test-python.sh: $*" >&2; }

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  say "$python is missing or older than 3.10"
  exit 1
fi
# The build tool lives in its own venv, kept between runs (no download once installed).
if ! "$build_venv/bin/python" -m maturin --version >/dev/null 2>&1; then
  rm -rf "$build_venv"
  "$python" -m venv "$build_venv"
  "$build_venv/bin/python" -m pip install --disable-pip-version-check -q 'maturin>=1.7,<2'
fi
rm -rf "$wheels"
(cd "$repo/python" && "$build_venv/bin/python" -m maturin build --profile dev --strip \
  --features workspace-test-features,fault-injection \
  --out "$wheels" --quiet)
wheel="$(ls "$wheels"/gpumem-*.whl)"
# A fresh environment each run: the wheel must install and work on its own.
"$python" -m venv --clear "$test_venv"
"$test_venv/bin/python" -m pip install --disable-pip-version-check -q "$wheel" pytest numpy

if [ -z "${GPUMEM_CLI:-}" ] && [ -x "$repo/target/debug/gpumem" ]; then
  export GPUMEM_CLI="$repo/target/debug/gpumem"
fi
cd "$repo/python/tests"   # not python/: its gpumem/ sources must not shadow the installed one
status=0
"$test_venv/bin/python" -m pytest -p no:cacheprovider "$@" || status=$?
if [ "$status" -eq 5 ]; then
  say "pytest collected no tests"
  exit 1
fi
exit "$status"
