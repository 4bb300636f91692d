#!/usr/bin/env bash
# Every check that needs an NVIDIA GPU and its driver, with a table of what passed and failed.
# CI has no GPU: run this on a machine with one. Needs a Rust toolchain; no CUDA toolkit.
#
# Checks (each runs its tests one at a time: they share the GPU's memory):
#   gpumem-cuda  the CUDA backend's tests, the #[ignore]d GPU ones included
#                (cargo test -p gpumem-cuda -- --include-ignored); the mock-driver scenarios
#                are skipped here (they run in a child process of mock_driver.rs's own test)
#   gpumem-cli   `gpumem selftest --backend cuda` for every policy (round trips, memory given
#                back, a real trace with every byte checked), as devices_cli.rs's ignored test
#   gpumem-array arrays, the batch iterator on a copy stream and managed memory
#                (UnifiedArray with prefetch/advice) on the GPU (tests/cuda.rs)
#   bench-arrays the arrays benchmark on CUDA (copies through arrays against raw copies,
#                pool against cuMemAlloc/cuMemFree); a benchmark has no test rows, so a
#                check named bench-* passes on exit status 0 and its figures are in its log
#   gpumem-watch NVML's ignored test (every GPU seen with memory and a UUID), and
#                `gpumem diagnose`, `exporter` and `top` on the live GPU (scripts/watch-gpu-check.sh)
#   gpumem-python PyTorch (GPT-2-shaped and ResNet training) and CuPy on gpumem.torch.use() /
#                gpumem.cupy.use() against PyTorch's allocator (scripts/gpu-python.sh; needs
#                TORCH_PYTHON or the network to install torch)
#
# Exit status: 0 all passed; 1 something failed (or did not build); 77 no NVIDIA GPU here, so
# nothing was run (said plainly). Arguments go to the test binaries as a name filter
# (e.g. `scripts/gpu-check.sh vmm`). Environment: GPUMEM_CUDA_DEVICE (the device ordinal the
# tests use, default 0); GPUMEM_GPU_CHECK_FORCE=1 runs the checks even where no GPU is seen
# (to try this script itself); logs go to target/gpu-check/.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
say() { echo "gpu-check.sh: $*" >&2; }

# The checks: "name|command". Add a line for each new check that needs a GPU.
checks=(
  "gpumem-cuda|cargo test -p gpumem-cuda --locked --no-fail-fast -- --include-ignored --test-threads=1 --skip mock_scenarios --skip mock_without_a_device"
  "gpumem-cli|cargo test -p gpumem-cli --locked --no-fail-fast --test devices_cli -- --include-ignored --test-threads=1 --nocapture"
  "gpumem-array|cargo test -p gpumem-array --locked --no-fail-fast --test cuda -- --include-ignored --test-threads=1"
  "bench-arrays|cargo bench -p gpumem-bench --locked --bench arrays -- cuda --warm-up-time 1 --measurement-time 2"
  "gpumem-watch|cargo test -p gpumem-watch --locked --no-fail-fast --lib -- --include-ignored --test-threads=1 --nocapture"
  "watch-cli|bash scripts/watch-gpu-check.sh"
  "gpumem-python|bash scripts/gpu-python.sh"
)

gpu_list=""
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu_list="$(nvidia-smi -L 2>/dev/null | grep '^GPU ' || true)"
elif compgen -G '/dev/nvidia[0-9]*' >/dev/null; then
  gpu_list="$(ls /dev/nvidia[0-9]*)"
fi
if [ -z "$gpu_list" ]; then
  if [ "${GPUMEM_GPU_CHECK_FORCE:-0}" != 1 ]; then
    say "no NVIDIA GPU on this machine (nvidia-smi lists none, no /dev/nvidiaN): nothing was run."
    say "The GPU checks need an NVIDIA GPU and driver; run this script on such a machine."
    exit 77
  fi
  say "no NVIDIA GPU seen; running anyway (GPUMEM_GPU_CHECK_FORCE=1): expect failures"
else
  say "GPUs:"
  echo "$gpu_list" | sed 's/^/  /' >&2
fi

logs="$repo/target/gpu-check"
mkdir -p "$logs"
rows=()
failed=0
passed=0
for entry in "${checks[@]}"; do
  name="${entry%%|*}"
  command="${entry#*|}"
  log="$logs/$name.log"
  say "running $name: $command $*"
  # shellcheck disable=SC2086 # the command is a word list on purpose
  $command "$@" 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  # One row per test: "suite test result", from cargo's "Running <suite>" and "test <name> ... <r>".
  mapfile -t results < <(awk '
    /^ *Running unittests / { suite = "unit"; next }
    /^ *Running / { suite = $2; sub(/^tests\//, "", suite); next }
    /^ *Doc-tests / { suite = "doc"; next }
    /^test .* \.\.\. (ok|FAILED|ignored)/ {
      r = ($NF == "ok") ? "passed" : ($NF == "FAILED") ? "FAILED" : "ignored"
      print suite, $2, r
    }' "$log")
  if [ "${#results[@]}" -eq 0 ] && [[ "$name" == bench-* ]] && [ "$status" -eq 0 ]; then
    rows+=("$name - (benchmark ran; figures in its log) passed")
    passed=$((passed + 1))
    continue
  fi
  if [ "${#results[@]}" -eq 0 ]; then
    rows+=("$name - (no tests ran: build failed?) FAILED")
    failed=$((failed + 1))
    continue
  fi
  for r in "${results[@]}"; do
    rows+=("$name $r")
    case "$r" in
      *" passed") passed=$((passed + 1)) ;;
      *" FAILED") failed=$((failed + 1)) ;;
    esac
  done
  if [ "$status" -ne 0 ] && ! printf '%s\n' "${results[@]}" | grep -q ' FAILED$'; then
    rows+=("$name - (exit status $status) FAILED")
    failed=$((failed + 1))
  fi
done

# The table: check, suite, test, result; the test column as wide as the longest name.
width=4
for row in "${rows[@]}"; do
  # shellcheck disable=SC2086 # split the row into its fields
  set -- $row
  test="${*:3:$#-3}"
  [ "${#test}" -gt "$width" ] && width=${#test}
done
echo
echo "GPU check summary"
printf "%-14s %-14s %-${width}s %s\n" check suite test result
printf "%-14s %-14s %-${width}s %s\n" ----- ----- ---- ------
for row in "${rows[@]}"; do
  # shellcheck disable=SC2086 # split the row into its fields
  set -- $row
  printf "%-14s %-14s %-${width}s %s\n" "$1" "$2" "${*:3:$#-3}" "${*: -1}"
done
echo
echo "$passed passed, $failed failed (logs: ${logs#"$repo"/})"
[ "$failed" -eq 0 ]
