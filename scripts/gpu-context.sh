#!/usr/bin/env bash
# What a CUDA training process holds outside PyTorch's caching allocator, stage by stage: the
# CUDA context, cuBLAS and cuDNN handles, a training step's kernels, NCCL, and bitsandbytes'
# and flash-attn's modules where they import (tools/src/gpumem_devtools/measure_context.py).
# nvidia-smi's figure for a process is its reserved memory plus this; `gpumem plan` counts it
# as `framework` (--context-mib, default 500) and NCCL's buffers. scripts/gpu-check.sh runs it
# (check "context"; a minute on an H200). Results: target/gpu-check/context.jsonl, and one test
# line per stage for the check's table (ignored: the stage's library is not installed).
# Environment: TORCH_PYTHON, a Python with a CUDA build of torch and transformers (default
# python3). Exit status: 0 measured; 1 a stage failed; 77 no CUDA device (nothing measured).
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${TORCH_PYTHON:-python3}"
out="$repo/target/gpu-check/context.jsonl"
mkdir -p "$(dirname "$out")"
PYTHONPATH="$repo/tools/src${PYTHONPATH:+:$PYTHONPATH}" "$python" -m gpumem_devtools.measure_context \
  --out "$out" || exit
"$python" - "$out" <<'PY'
import json
import sys

with open(sys.argv[1]) as f:
    for line in f.read().splitlines()[1:]:
        row = json.loads(line)
        print(f"test context::{row['stage']} ... {'ignored' if 'skipped' in row else 'ok'}")
PY
