#!/usr/bin/env bash
# Regenerates docs/images/report.png, the README's picture of `gpumem report`: the committed
# BERT training trace replayed through every policy against an 800 MiB GPU (PyTorch's default
# allocator runs out of memory there), rendered in headless Chromium.
#   bash scripts/report-screenshot.sh            # builds gpumem (release) first
#   GPUMEM=target/debug/gpumem bash scripts/report-screenshot.sh
# Chromium: `bash scripts/install-test-deps.sh` installs it (Debian package `chromium`).
set -euo pipefail
cd "$(dirname "$0")/.."
browser="$(command -v chromium || command -v chromium-browser || true)"
if [ -z "$browser" ]; then
  echo "report-screenshot.sh: no chromium on PATH; run scripts/install-test-deps.sh" >&2
  exit 1
fi
if [ -z "${GPUMEM:-}" ]; then
  cargo build -q --release -p gpumem-cli
  GPUMEM=target/release/gpumem
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$GPUMEM" report testdata/traces/bert-12l-train-b8-s128.jsonl.gz --capacity 800MiB \
  -o "$work/report.html"
mkdir -p docs/images
"$browser" --headless --no-sandbox --disable-gpu --disable-background-networking \
  --disable-component-update --disable-sync --no-first-run --hide-scrollbars \
  --user-data-dir="$work/profile" --window-size=1280,2080 --virtual-time-budget=5000 \
  --screenshot="$PWD/docs/images/report.png" "file://$work/report.html" 2>/dev/null
echo "wrote docs/images/report.png"
