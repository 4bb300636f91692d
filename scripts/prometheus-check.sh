#!/usr/bin/env bash
# A real Prometheus server scrapes `gpumem exporter` on loopback; its HTTP API is then asked
# for the series, and the values are checked against the recording the exporter serves.
# Not part of CI (it installs a server and waits for scrapes: about 20 s); run it by hand:
#
#   bash scripts/prometheus-check.sh            # serves testdata/watch/demo.jsonl
#   bash scripts/prometheus-check.sh --live     # the live machine (NVML + published pools)
#
# Installs Debian's `prometheus` package when missing (as root, or with password-less sudo).
# Exit status 0 when every expected series came back with the expected value.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "prometheus-check.sh: $*" >&2; }

if ! command -v prometheus >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo -n"
  say "installing Debian's prometheus package"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
prometheus --version 2>&1 | head -1 >&2

samples=(--samples testdata/watch/demo.jsonl)
[ "${1:-}" = --live ] && samples=()
cargo build -p gpumem-cli --locked -q
work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

target/debug/gpumem exporter --listen 127.0.0.1:0 "${samples[@]}" 2>"$work/exporter.log" &
pids+=($!)
for _ in $(seq 100); do grep -q "serving metrics" "$work/exporter.log" && break; sleep 0.1; done
exporter="$(sed -n 's|^gpumem: serving metrics on http://\(.*\)/metrics$|\1|p' "$work/exporter.log")"
[ -n "$exporter" ] || { cat "$work/exporter.log" >&2; exit 1; }
say "exporter on $exporter"

port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
cat >"$work/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: gpumem
    static_configs:
      - targets: ["$exporter"]
YAML
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
  --web.listen-address="127.0.0.1:$port" >"$work/prometheus.log" 2>&1 &
pids+=($!)
api="http://127.0.0.1:$port/api/v1"
say "prometheus on 127.0.0.1:$port"

query() { curl -sS --fail --get "$api/query" --data-urlencode "query=$1"; }
for _ in $(seq 300); do
  if query 'DCGM_FI_DEV_FB_USED' 2>/dev/null | grep -q '"value"'; then break; fi
  sleep 0.1
done
curl -sS --fail "$api/targets" | python3 -c '
import json, sys
for t in json.load(sys.stdin)["data"]["activeTargets"]:
    print("target", t["scrapeUrl"], "health", t["health"], "last error", repr(t["lastError"]))
    assert t["health"] == "up", t'

failed=0
check() { # query expected-value (or "any")
  local answer
  answer="$(query "$1")"
  python3 - "$1" "$2" "$answer" <<'PY' || failed=1
import json, sys
query, expected, answer = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
result = answer["data"]["result"]
for series in result:
    print(f"{query:70} {series['metric']} = {series['value'][1]}")
if not result:
    sys.exit(f"{query}: no series")
if expected != "any" and float(result[0]["value"][1]) != float(expected):
    sys.exit(f"{query}: {result[0]['value'][1]} != {expected}")
PY
}
if [ "${#samples[@]}" -gt 0 ]; then
  # The demo recording: 70.5 GiB used of 80 GiB on both GPUs; pid 4300's torch pool holds
  # 69 GiB for 38 GiB allocated.
  check 'DCGM_FI_DEV_FB_USED{gpu="0",Hostname="gpu-node-01"}' 72192
  check 'DCGM_FI_DEV_FB_FREE{gpu="1"}' 9728
  check 'DCGM_FI_DEV_GPU_UTIL{gpu="0"}' any
  check 'DCGM_FI_DEV_POWER_USAGE{gpu="1"}' any
  check 'DCGM_FI_PROF_PCIE_RX_BYTES{gpu="0"}' 2000000000
  check 'gpumem_pool_reserved_bytes{pid="4300",policy="torch"}' 74088185856
  check 'gpumem_pool_allocated_bytes{pid="4300"}' 40802189312
  check 'gpumem_pool_fragmentation_ratio{pid="4300"}' any
  check 'sum by (gpu) (gpumem_pool_reserved_bytes) / on (gpu) group_left DCGM_FI_DEV_FB_TOTAL / 1048576' any
else
  check 'DCGM_FI_DEV_FB_USED' any
fi
[ "$failed" -eq 0 ] && say "every series came back from Prometheus" || say "some series were missing or wrong"
exit "$failed"
