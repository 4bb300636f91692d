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
#   allocators   a Llama-shaped and a variable-length GPT-2 training run, Llama-shaped serving
#                and ResNet-50 under PyTorch's three allocators and gpumem's three policies,
#                gpumem's snapshots replayed, memcheck (scripts/gpu-allocators.sh; TORCH_PYTHON)
#   context      what a training process holds outside PyTorch's pool, stage by stage: the
#                CUDA context, cuBLAS/cuDNN, a step's kernels, NCCL, bitsandbytes, flash-attn
#                (scripts/gpu-context.sh; TORCH_PYTHON; target/gpu-check/context.jsonl)
#   fsdp         FSDP1 with PEFT LoRA/QLoRA and parameter offload over Llama-2-7B and 70B
#                blocks at 2 x 2048 tokens, rank 0 alone on PyTorch's fake process group, each
#                case's peaks beside `gpumem plan`'s (scripts/gpu-fsdp.sh; TORCH_PYTHON with
#                peft and bitsandbytes; target/gpu-check/fsdp.jsonl)
#
# A GPU machine without a Rust toolchain (a lent cloud box, a cluster node) runs the same checks
# from a bundle built elsewhere:
#   scripts/gpu-check.sh --bundle DIR        (here, no GPU needed) builds every test binary, the
#                                            gpumem binary and the Python wheel into DIR
#   scripts/gpu-check.sh --from-bundle DIR   (there) runs them; needs bash, and for the Python
#                                            check a python3 with CUDA PyTorch (TORCH_PYTHON)
# A bundle's binaries are x86-64 Linux, built with this machine's glibc; the tests read no file
# of the source tree.
#
# Exit status: 0 all passed; 1 something failed (or did not build); 77 no NVIDIA GPU here, so
# nothing was run (said plainly). Arguments after the mode go to the test binaries as a name
# filter (e.g. `scripts/gpu-check.sh vmm`). Environment: GPUMEM_CUDA_DEVICE (the device ordinal
# the tests use, default 0); GPUMEM_GPU_CHECK_FORCE=1 runs the checks even where no GPU is seen
# (to try this script itself); logs go to target/gpu-check/ (GPUMEM_GPU_CHECK_LOGS overrides);
# GPUMEM_GPU_CHECKS=name,name runs (and bundles) only the checks named, for a short GPU lease.
# GPUMEM_ALLOCATORS_ARGS holds arguments for the allocators check (e.g. "--budget-s 300 --reps 1").
set -uo pipefail
say() { echo "gpu-check.sh: $*" >&2; }
mode=cargo
bundle=""
case "${1:-}" in
  --bundle | --from-bundle)
    [ -n "${2:-}" ] || { say "$1 needs a directory (e.g. $1 target/gpu-bundle)"; exit 2; }
    mode="${1#--}"
    bundle="$(mkdir -p "$2" && cd "$2" && pwd)" || { say "$1: cannot use $2 as a directory"; exit 2; }
    shift 2
    ;;
  --*)
    say "unknown option $1: the modes are --bundle DIR and --from-bundle DIR (or none)"
    exit 2
    ;;
esac
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

# The checks: "name|what cargo builds|the test binary's arguments". What cargo builds is a
# `cargo test`/`cargo bench` selection, or `script PATH` for a script run as it is. Add a line
# for each new check that needs a GPU.
checks=(
  "gpumem-cuda|test -p gpumem-cuda|--include-ignored --test-threads=1 --skip mock_scenarios --skip mock_without_a_device"
  "gpumem-cli|test -p gpumem-cli --test devices_cli|--include-ignored --test-threads=1 --nocapture"
  "gpumem-array|test -p gpumem-array --test cuda|--include-ignored --test-threads=1"
  "bench-arrays|bench -p gpumem-bench --bench arrays|cuda --warm-up-time 1 --measurement-time 2"
  "gpumem-watch|test -p gpumem-watch --lib|--include-ignored --test-threads=1 --nocapture"
  "watch-cli|script scripts/watch-gpu-check.sh|"
  "gpumem-python|script scripts/gpu-python.sh|"
  "allocators|script scripts/gpu-allocators.sh|"
  "context|script scripts/gpu-context.sh|"
  "fsdp|script scripts/gpu-fsdp.sh|"
)
if [ -n "${GPUMEM_GPU_CHECKS:-}" ]; then
  chosen=()
  IFS=',' read -ra wanted <<<"$GPUMEM_GPU_CHECKS"
  for want in "${wanted[@]}"; do
    found=""
    for entry in "${checks[@]}"; do [ "${entry%%|*}" = "$want" ] && found="$entry"; done
    if [ -z "$found" ]; then
      say "GPUMEM_GPU_CHECKS names '$want', which is no check; the checks are:" \
        "$(printf '%s ' "${checks[@]%%|*}")"
      exit 2
    fi
    chosen+=("$found")
  done
  checks=("${chosen[@]}")
fi

# --bundle: every test binary (named in cargo's JSON messages), the gpumem binary, the wheel,
# and the scripts, laid out like the repository so that the scripts find each other.
if [ "$mode" = bundle ]; then
  rm -rf "${bundle:?}"/{bin,wheel,scripts,python,tools,testdata,checks.txt}
  mkdir -p "$bundle/bin" "$bundle/scripts" "$bundle/python/checks" "$bundle/tools/src"
  : >"$bundle/checks.txt" # the test binaries' list; empty when only scripts are chosen
  for entry in "${checks[@]}"; do
    IFS='|' read -r name selection _ <<<"$entry"
    [[ "$selection" == script* ]] && continue
    say "building $name: cargo $selection"
    # shellcheck disable=SC2086 # the selection is a word list on purpose
    cargo $selection --locked --no-run --message-format=json-render-diagnostics >"$bundle/cargo.json" \
      || { say "$name did not build"; exit 1; }
    # Test and bench harnesses only (binaries built for the tests are named "bin").
    grep '"executable":"/' "$bundle/cargo.json" | grep -v '"kind":\["bin"\]' | while read -r message; do
      executable="$(sed 's/.*"executable":"\([^"]*\)".*/\1/' <<<"$message")"
      target="$(sed 's/.*"target":{[^}]*"name":"\([^"]*\)".*/\1/' <<<"$message")"
      if grep -q '"kind":\["lib"\]' <<<"$message"; then label="unittests src/lib.rs"
      elif grep -q '"kind":\["bench"\]' <<<"$message"; then label="benches/$target.rs"
      else label="tests/$target.rs"; fi
      file="bin/$name-$(basename "$executable")"
      cp "$executable" "$bundle/$file" && strip "$bundle/$file"
      echo "$name|$label|$file" >>"$bundle/checks.txt"
    done
  done
  rm -f "$bundle/cargo.json"
  cargo build -p gpumem-cli --locked --quiet && cp target/debug/gpumem "$bundle/bin/gpumem" \
    && strip "$bundle/bin/gpumem" || { say "the gpumem binary did not build"; exit 1; }
  bash scripts/gpu-python.sh --build-wheel "$bundle/wheel" || { say "the wheel did not build"; exit 1; }
  # compute-sanitizer for the allocators check's memcheck runs (CUDA 13.0, as the H200 had).
  python3 -m pip download -q --no-deps -d "$bundle/wheel" \
    "${GPUMEM_SANITIZER_SPEC:-nvidia-cuda-sanitizer-api>=13.0,<13.1}" \
    || say "no compute-sanitizer wheel: the memcheck runs will say not installed"
  cp scripts/gpu-check.sh scripts/watch-gpu-check.sh scripts/gpu-python.sh \
    scripts/gpu-allocators.sh scripts/gpu-context.sh scripts/gpu-fsdp.sh "$bundle/scripts/"
  cp python/checks/torch_gpu.py python/checks/allocators_gpu.py "$bundle/python/checks/"
  cp -r tools/src/gpumem_devtools "$bundle/tools/src/"
  # The devtools' commands run in a checkout: the bundle is one for them (the fsdp check
  # writes its model configs under testdata/).
  cp tools/pyproject.toml "$bundle/tools/" && mkdir -p "$bundle/testdata/plan/configs"
  say "bundle in $bundle ($(du -sh "$bundle" | cut -f1)); on the GPU machine:"
  say "  $bundle/scripts/gpu-check.sh --from-bundle $bundle"
  exit 0
fi
if [ "$mode" = from-bundle ]; then
  [ -f "$bundle/checks.txt" ] || { say "$bundle holds no checks.txt: make it with --bundle"; exit 2; }
  export GPUMEM_BIN="$bundle/bin/gpumem"
  GPUMEM_WHEEL="$(ls "$bundle"/wheel/gpumem-*.whl 2>/dev/null | head -1)"
  export GPUMEM_WHEEL
fi

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

# Runs one check, its output on stdout (cargo's "Running SUITE" lines included, which the
# table reads); its status is the check's.
run_check() { # name selection arguments [filter...]
  local name="$1" selection="$2" arguments="$3" status=0 label file
  shift 3
  if [[ "$selection" == script* ]]; then
    echo "     Running ${selection##*/}"
    local extra=()
    # shellcheck disable=SC2206 # a word list on purpose
    [ "$name" = allocators ] && extra=(${GPUMEM_ALLOCATORS_ARGS:-})
    bash "${selection#script }" "${extra[@]}"
    return
  fi
  if [ "$mode" = cargo ]; then
    # shellcheck disable=SC2086 # word lists on purpose
    cargo $selection --locked --no-fail-fast -- $arguments "$@"
    return
  fi
  [[ "$selection" == bench* ]] && arguments="--bench $arguments"
  while IFS='|' read -r _ label file; do
    echo "     Running $label ($file)"
    # shellcheck disable=SC2086 # word lists on purpose
    "$bundle/$file" $arguments "$@" || status=1
  done < <(grep "^$name|" "$bundle/checks.txt")
  return "$status"
}

logs="${GPUMEM_GPU_CHECK_LOGS:-$repo/target/gpu-check}"
mkdir -p "$logs"
rows=()
failed=0
passed=0
for entry in "${checks[@]}"; do
  IFS='|' read -r name selection arguments <<<"$entry"
  log="$logs/$name.log"
  say "running $name ($mode): $selection $arguments $*"
  run_check "$name" "$selection" "$arguments" "$@" 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  # One row per test: "suite test result", from cargo's "Running <suite>" and "test <name> ... <r>".
  mapfile -t results < <(awk '
    /^ *Running unittests / { suite = "unit"; next }
    /^ *Running / { suite = $2; sub(/^tests\//, "", suite); next }
    /^ *Doc-tests / { suite = "doc"; next }
    function verdict(word) { return word == "ok" ? "passed" : word == "FAILED" ? "FAILED" : "ignored" }
    /^test .* \.\.\. / {
      if ($NF ~ /^(ok|FAILED|ignored)$/) { print suite, $2, verdict($NF); pending = "" }
      else pending = $2  # --nocapture: the test printed before its verdict
      next
    }
    pending != "" && /^(ok|FAILED|ignored)$/ { print suite, pending, verdict($1); pending = "" }
    ' "$log")
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
