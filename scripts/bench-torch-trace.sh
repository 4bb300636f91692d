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
build_venv="$repo/target/python-build-venv"
site="$repo/target/torch-cpu-site"
"$torch_python" -c 'import torch, transformers, gpumem_devtools.recorder' || {
  echo "bench-torch-trace.sh: $torch_python needs torch, transformers and tools/ (pip install './tools[torch]')" >&2
  exit 1
}
if ! "$build_venv/bin/python" -m maturin --version >/dev/null 2>&1; then
  python3 -m venv "$build_venv"
  "$build_venv/bin/python" -m pip install -q 'maturin>=1.7,<2'
fi
rm -rf "$repo/target/torch-cpu-wheel" "$site"
(cd "$repo/python" && "$build_venv/bin/python" -m maturin build --profile dev --strip \
  --out "$repo/target/torch-cpu-wheel" --quiet)
"$torch_python" -m pip install -q --no-deps --target "$site" "$repo"/target/torch-cpu-wheel/gpumem-*.whl
cd "$repo/target"
PYTHONPATH="$site" "$torch_python" "$repo/python/checks/torch_trace_bench.py" "$@"
