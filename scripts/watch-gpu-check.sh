#!/usr/bin/env bash
# `gpumem diagnose`, `gpumem exporter` and `gpumem top` on this machine's real GPUs (NVML), as
# scripts/gpu-check.sh runs them; prints one "test NAME ... ok|FAILED" line per check. Needs
# an NVIDIA driver, tmux and curl. GPUMEM_BIN names a gpumem binary built already (else cargo
# builds one).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "${GPUMEM_BIN:-}" ]; then
  gpumem="$GPUMEM_BIN"
else
  cargo build -p gpumem-cli --locked -q || exit 1
  gpumem="$PWD/target/debug/gpumem"
fi
failed=0
result() { # name status
  if [ "$2" -eq 0 ]; then echo "test $1 ... ok"; else echo "test $1 ... FAILED"; failed=1; fi
}

out="$("$gpumem" diagnose --duration 5s --interval 500ms 2>&1)"
echo "$out"
echo "$out" | grep -q "over [0-9]* samples" && ! echo "$out" | grep -q "no NVIDIA GPU"
result watch_diagnose_live $?

log="$(mktemp)"
"$gpumem" exporter --listen 127.0.0.1:0 2>"$log" &
exporter=$!
for _ in $(seq 50); do grep -q "serving metrics" "$log" && break; sleep 0.1; done
url="$(sed -n 's/^gpumem: serving metrics on //p' "$log")"
metrics="$(curl -sS --fail "$url")"
kill "$exporter"
echo "$metrics" | grep -E '^DCGM_FI_DEV_(FB_USED|GPU_UTIL|POWER_USAGE)\{gpu="0",UUID="GPU-' | head -5
echo "$metrics" | grep -q '^DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-'
result watch_exporter_live $?

socket="gpumem-watch-gpu-check-$$"
tmux -L "$socket" new-session -d -s top -x 150 -y 45 "$gpumem top --interval 500ms"
sleep 3
screen="$(tmux -L "$socket" capture-pane -p -t top)"
echo "$screen"
tmux -L "$socket" send-keys -t top q
sleep 1
echo "$screen" | grep -q "^GPU 0 " && ! tmux -L "$socket" has-session -t top 2>/dev/null
result watch_top_live $?
tmux -L "$socket" kill-server 2>/dev/null
rm -f "$log"
exit "$failed"
