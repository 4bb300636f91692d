#!/usr/bin/env bash
# Opt-in (needs PyTorch, transformers and the tools package; no GPU; never in CI):
# gpumem.torch.trace beside PyTorch's MemTracker on the same models and step
# (python/checks/torch_trace_bench.py: a catalogue GPT-2, a hand-written decoder, a UNet, a
# speech-like model), printing the accuracy and wall-time tables of docs/benchmarks.md.
# TORCH_PYTHON as for scripts/test-torch-cpu.sh (default target/torch-venv/bin/python);
# BENCH_REPEAT: runs per timing, the median reported (default 3).
# Builds and installs the wheel beside that PyTorch as test-torch-cpu.sh does.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
torch_python="${TORCH_PYTHON:-$repo/target/torch-venv/bin/python}"
"$torch_python" -c 'import torch, transformers, gpumem_devtools.recorder' || {
  echo "bench-torch-trace.sh: $torch_python needs torch, transformers and tools/ (pip install './tools[torch]')" >&2
  exit 1
}
# Builds the wheel and installs it into $site beside that PyTorch.
source "$repo/scripts/torch-cpu-site.sh"
cd "$repo/target"
PYTHONPATH="$site" "$torch_python" "$repo/python/checks/torch_trace_bench.py" "$@"
