#!/usr/bin/env bash
# PyTorch and CuPy on gpumem on an NVIDIA GPU (scripts/gpu-check.sh runs it): builds the wheel
# (release, as users get it), installs it beside a PyTorch with CUDA and runs
# python/checks/torch_gpu.py (GPT-2-shaped and ResNet training steps with PyTorch's allocator
# and with gpumem.torch.use(): identical losses, peak reserved, step time, snapshot, forced
# OOM; a CuPy workload when CuPy is installed; PyTorch's own snapshot replayed). Results of its
# run on an H200: docs/gpu.md.
# Environment: TORCH_PYTHON, a Python with a CUDA build of torch (and optionally cupy);
# without it a venv target/gpu-python-venv gets torch (and cupy-cuda12x, if it installs) from
# PyPI, which needs the network. GPUMEM_WHEEL, a wheel built already (gpu-check.sh's bundles
# carry one), is installed instead of building one. `gpu-python.sh --build-wheel DIR` only
# builds the wheel into DIR (no GPU needed). The PyTorch snapshots the check records are kept
# in target/gpu-check/snapshots.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
say() { echo "gpu-python.sh: $*" >&2; }
build_venv="$repo/target/python-build-venv"
site="$repo/target/gpu-python-site"

# Builds the wheel (release, as users get it) into $1.
build_wheel() {
  if ! "$build_venv/bin/python" -m maturin --version >/dev/null 2>&1; then
    python3 -m venv "$build_venv"
    "$build_venv/bin/python" -m pip install -q 'maturin>=1.7,<2'
  fi
  local out
  out="$(mkdir -p "$1" && cd "$1" && pwd)" || return 1
  rm -f "$out"/gpumem-*.whl
  (cd "$repo/python" && "$build_venv/bin/python" -m maturin build --release --strip \
    --out "$out" --quiet)
}
if [ "${1:-}" = --build-wheel ]; then
  [ -n "${2:-}" ] || { say "--build-wheel needs a directory"; exit 2; }
  build_wheel "$2"
  exit
fi
if [ -z "${TORCH_PYTHON:-}" ]; then
  venv="$repo/target/gpu-python-venv"
  if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q torch numpy || { say "cannot install torch"; exit 1; }
    "$venv/bin/python" -m pip install -q cupy-cuda12x || say "CuPy not installed: its check is skipped"
  fi
  TORCH_PYTHON="$venv/bin/python"
fi
"$TORCH_PYTHON" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' \
  || { say "$TORCH_PYTHON: torch sees no CUDA device"; exit 1; }
rm -rf "$site"
if [ -z "${GPUMEM_WHEEL:-}" ]; then
  build_wheel "$repo/target/gpu-wheels"
  GPUMEM_WHEEL="$(ls "$repo"/target/gpu-wheels/gpumem-*.whl)"
fi
"$TORCH_PYTHON" -m pip install -q --no-deps --no-index --target "$site" "$GPUMEM_WHEEL"
mkdir -p "$repo/target/gpu-check"
cd "$repo/target"
PYTHONPATH="$site" "$TORCH_PYTHON" "$repo/python/checks/torch_gpu.py" \
  --out "$repo/target/gpu-check/python-results.json" --keep "$repo/target/gpu-check/snapshots"
