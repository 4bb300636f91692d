#!/usr/bin/env bash
# FSDP1 on one GPU at the scale of the published FSDP rows: PEFT LoRA and QLoRA over Llama-2-7B's
# and Llama-2-70B's blocks at 2 x 2048 tokens with checkpointing, QLoRA with parameter offload,
# and FSDP1 wrapping the blocks alone (`python -m gpumem_devtools.measure_distributed --device
# cuda`). Rank 0 of each case runs alone on PyTorch's fake process group: FSDP's streams, its
# unshard pool, the rate limiter and the offload copies are real, the collectives do nothing and
# NCCL is never initialised. Each case's measured peaks are printed beside `gpumem plan`'s for
# the same settings. scripts/gpu-check.sh runs it (check "fsdp"; a few minutes on an H200).
# Results: target/gpu-check/fsdp.jsonl and rank 0's CUDA allocation traces in
# target/gpu-check/fsdp-traces/, and one test line per case for the check's table.
# Environment: TORCH_PYTHON, a Python with a CUDA build of torch, transformers, peft and
# bitsandbytes (default python3); GPUMEM_BIN, a gpumem binary (default: target/release/gpumem,
# built with cargo where it is missing). Exit status: 0 measured; 1 a case failed; 77 no CUDA
# device (nothing measured).
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${TORCH_PYTHON:-python3}"
logs="${GPUMEM_GPU_CHECK_LOGS:-$repo/target/gpu-check}"
out="$logs/fsdp.jsonl"
mkdir -p "$logs"
gpumem="${GPUMEM_BIN:-$repo/target/release/gpumem}"
if [ ! -x "$gpumem" ]; then
  (cd "$repo" && cargo build --release -p gpumem-cli --quiet) || {
    echo "gpu-fsdp.sh: no gpumem binary (set GPUMEM_BIN or build gpumem-cli)" >&2
    exit 1
  }
fi
PYTHONPATH="$repo/tools/src${PYTHONPATH:+:$PYTHONPATH}" "$python" -m gpumem_devtools.measure_distributed \
  --device cuda --redo --repo "$repo" --out "$out" --traces "$logs/fsdp-traces" || exit
"$python" - "$out" "$gpumem" "$repo" <<'PY'
import json
import subprocess
import sys

out, gpumem, repo = sys.argv[1:4]
print(f"{'case':<72} {'allocated':>9} {'planned':>9} {'reserved':>9} {'planned':>9}  (GiB)")
for line in open(out).read().splitlines():
    row = json.loads(line)
    flags = ["--config", f"{repo}/{row['config']}", "--json"]
    for key, value in row["settings"].items():
        flag = "--" + key.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    plan = subprocess.run([gpumem, "plan", *flags], capture_output=True, text=True)
    measured = row["measured"]
    if plan.returncode != 0:
        print(f"test fsdp::{row['id']} ... FAILED (gpumem plan: {plan.stderr.strip()})")
        continue
    planned = json.loads(plan.stdout)
    gib = 2**30
    print(f"{row['id']:<72} {measured['peak_allocated_bytes'] / gib:9.2f} "
          f"{planned['peak_allocated_bytes'] / gib:9.2f} "
          f"{measured['peak_reserved_bytes'] / gib:9.2f} "
          f"{planned['peak_reserved_bytes'] / gib:9.2f}")
    print(f"test fsdp::{row['id']} ... ok")
PY
