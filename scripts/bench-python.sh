#!/usr/bin/env bash
# gpumem.plan's speed from Python (python/benchmarks, pytest-benchmark), beside the extension
# call alone; the Rust library's own figure is `cargo bench -p gpumem-replay --bench
# plan_report`. Builds and installs the wheel as scripts/test-python.sh does (running its
# quickest test file), then adds pytest-benchmark to that environment. Not part of CI.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo/scripts/test-python.sh" -q test_results.py
venv="$repo/target/python-test-venv"
"$venv/bin/python" -m pip install --disable-pip-version-check -q 'pytest-benchmark>=4'
cd "$repo/python/benchmarks"
"$venv/bin/python" -m pytest -p no:cacheprovider -q \
  --benchmark-columns=min,median,mean,rounds --benchmark-sort=name "$@"
