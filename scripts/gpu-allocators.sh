#!/usr/bin/env bash
# PyTorch's CUDA allocators against gpumem's policies under real training and serving, on an
# NVIDIA GPU (scripts/gpu-check.sh runs it): python/checks/allocators_gpu.py runs a Llama-shaped
# decoder's training, GPT-2 with a new sequence length every step, Llama-shaped serving with a
# KV cache and ResNet-50 training under PyTorch's default, expandable_segments and
# cudaMallocAsync and under gpumem's torch, expandable and gpumem policies (each run its own
# process, two interleaved repetitions, about 8 minutes on an H200), replays gpumem's
# snapshots, runs compute-sanitizer's memcheck, and prints test lines and a table. Results:
# target/gpu-check/allocators.json; each run's log and snapshot: target/gpu-check/allocators-runs.
# Arguments go to allocators_gpu.py (--budget-s, --dry-run, --workloads, …).
# Environment: TORCH_PYTHON, a Python with a CUDA build of torch (without it a venv
# target/gpu-python-venv gets torch from PyPI, as scripts/gpu-python.sh does); GPUMEM_WHEEL, a
# wheel built already (bundles carry one; otherwise one is built); GPUMEM_BIN, the gpumem
# binary that replays the snapshots (default: the wheel's `python -m gpumem`);
# COMPUTE_SANITIZER, the compute-sanitizer to use. Without one on PATH or in /usr/local/cuda,
# a nvidia_cuda_sanitizer_api wheel beside GPUMEM_WHEEL (gpu-check.sh --bundle downloads one)
# is unpacked and used.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
say() { echo "gpu-allocators.sh: $*" >&2; }
site="$repo/target/gpu-allocators-site"
sanitizer_dir="$repo/target/gpu-sanitizer"  # not on PYTHONPATH: its nvidia/ must not shadow torch's
dry_run=0
case " $* " in *" --dry-run "*) dry_run=1 ;; esac

if [ -z "${TORCH_PYTHON:-}" ]; then
  venv="$repo/target/gpu-python-venv"
  if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q torch numpy || { say "cannot install torch"; exit 1; }
  fi
  TORCH_PYTHON="$venv/bin/python"
fi
if [ "$dry_run" = 0 ]; then
  "$TORCH_PYTHON" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' \
    || { say "$TORCH_PYTHON: torch sees no CUDA device"; exit 1; }
fi
rm -rf "$site"
if [ -z "${GPUMEM_WHEEL:-}" ]; then
  bash "$repo/scripts/gpu-python.sh" --build-wheel "$repo/target/gpu-wheels"
  GPUMEM_WHEEL="$(ls "$repo"/target/gpu-wheels/gpumem-*.whl)"
fi
"$TORCH_PYTHON" -m pip install -q --no-deps --no-index --target "$site" "$GPUMEM_WHEEL"
if [ -z "${COMPUTE_SANITIZER:-}" ] && ! command -v compute-sanitizer >/dev/null \
  && [ ! -x /usr/local/cuda/bin/compute-sanitizer ]; then
  wheels="$(dirname "$GPUMEM_WHEEL")"
  sanitizer_wheel="$(ls "$wheels"/nvidia_cuda_sanitizer_api-*.whl 2>/dev/null | head -1 || true)"
  if [ -n "$sanitizer_wheel" ]; then
    rm -rf "$sanitizer_dir"
    "$TORCH_PYTHON" -m pip install -q --no-deps --no-index --target "$sanitizer_dir" \
      "$sanitizer_wheel"
    # CUDA 13's wheel holds nvidia/cu13/bin/compute-sanitizer; CUDA 12's, nvidia/*/compute-sanitizer/.
    COMPUTE_SANITIZER="$(find "$sanitizer_dir/nvidia" -type f -name compute-sanitizer -perm -u+x \
      | head -1)"
    if [ -n "$COMPUTE_SANITIZER" ]; then
      export COMPUTE_SANITIZER
      say "compute-sanitizer from $(basename "$sanitizer_wheel")"
    else
      say "$(basename "$sanitizer_wheel") holds no compute-sanitizer: memcheck is reported as not installed"
    fi
  else
    say "no compute-sanitizer here: the memcheck runs are reported as not installed"
  fi
fi
mkdir -p "$repo/target/gpu-check"
cd "$repo/target"
PYTHONPATH="$site" "$TORCH_PYTHON" "$repo/python/checks/allocators_gpu.py" \
  --out "$repo/target/gpu-check/allocators.json" "$@"
