#!/usr/bin/env bash
# Opt-in (never in CI: PyTorch's wheels are gigabytes): gpumem with a real PyTorch and no GPU.
# TORCH_PYTHON is a Python with torch installed (default: target/torch-venv/bin/python, the
# environment tools/README.md's Install makes: python3 -m venv target/torch-venv &&
# target/torch-venv/bin/pip install './tools[torch]' peft; any CPU PyTorch >= 2.1 does for
# the first checks, the measured-set check needs the tools package and transformers 5.23). Builds the
# wheel as scripts/test-python.sh does, installs it beside that PyTorch (a target folder, the
# PyTorch environment untouched) and runs python/checks/torch_cpu.py: use() installs the
# pluggable allocator, a bad setting is refused, and gpumem's entry point throws PyTorch's own
# c10::OutOfMemoryError (a C++ program against the installation's headers and libc10); then
# python/checks/torch_trace_cpu.py: gpumem.torch.trace on fake tensors (the record equal to a
# real CPU run's, three models outside the planner's catalogue, ResNet-18 against the planner),
# and python/checks/torch_trace_validate.py --check: a few measured cases traced again and
# compared with testdata/plan/trace_validation.jsonl (skipped, saying so, without the tools
# package in that Python).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
torch_python="${TORCH_PYTHON:-$repo/target/torch-venv/bin/python}"
"$torch_python" -c 'import torch' || {
  echo "test-torch-cpu.sh: $torch_python has no torch: set TORCH_PYTHON to a Python with a CPU PyTorch" >&2
  exit 1
}
# Builds the wheel and installs it into $site beside that PyTorch.
source "$repo/scripts/torch-cpu-site.sh"
cd "$repo/target"
PYTHONPATH="$site" "$torch_python" "$repo/python/checks/torch_cpu.py"
PYTHONPATH="$site" "$torch_python" "$repo/python/checks/torch_trace_cpu.py"
if "$torch_python" -c 'import gpumem_devtools.models, transformers, torchvision' 2>/dev/null; then
  PYTHONPATH="$site" "$torch_python" "$repo/python/checks/torch_trace_validate.py" \
    --check "$repo/testdata/plan/trace_validation.jsonl"
else
  echo "test-torch-cpu.sh: torch_trace_validate.py --check skipped: $torch_python lacks the tools package, transformers or torchvision"
fi
# A panic in gpumem's PyTorch entry point reaches PyTorch as RuntimeError's std::exception: the
# C library built with its test-only fault-injection feature, checked against libc10.
cargo build --manifest-path "$repo/Cargo.toml" -p gpumem-capi --features fault-injection --quiet
"$torch_python" "$repo/python/checks/torch_cpu_panics.py" "$repo/target/debug/libgpumem_capi.so"
