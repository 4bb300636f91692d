#!/usr/bin/env bash
# CUDA allocation traces of the steps whose planned reserved memory is furthest from what real
# runs reserve (issue 28), for a GPU session to capture and crates/gpumem-replay/tests/planned.rs
# to compare with the plan (GPUMEM_EXTRA_TRACES; a trace whose header says device cuda is
# planned for the GPU). Each is a committed CPU trace's step (testdata/traces/sequence) or an
# H200 row the CPU cannot explain, captured with `gpumem-capture-trace --device cuda`:
#   llama2-2l-…-lora64-hold  AnswerDotAI's LoRA step at batch 6 × 2048 (two Llama-2-7B blocks):
#                            the CPU trace is 12 % above the plan's reserved; with transformers
#                            4.39.3 and PEFT 0.10.0 (GPUMEM_OLD_WHEELS) the benchmark's releases
#   vit-2l / clip-vision-4l  vision towers, planned 10-12 % low on the H200 with their CPU traces
#                            right: the patch convolution's cuDNN workspace, or the process
#   qwen2.5-2l loss-none     planned 15.7 % low on the H200, 4.1 % on CPU
# Usage: scripts/gpu-sequence-traces.sh [OUT_DIR]   (default target/gpu-sequence-traces)
# Environment: TORCH_PYTHON, a Python with a CUDA build of torch and transformers (default
# python3); GPUMEM_OLD_WHEELS, a directory of wheels (transformers 4.39.3, tokenizers 0.15.2,
# huggingface_hub 0.26.5, peft 0.10.0) installed into OUT_DIR/old-site for the LoRA step (get them
# with `pip download --no-deps -d DIR transformers==4.39.3 tokenizers==0.15.2
# huggingface_hub==0.26.5 peft==0.10.0` where there is a network); GPUMEM_SEQUENCE_DEVICE, the
# device (default cuda; cpu tries this script without a GPU). Exit status: 0 all captured, 1 a
# capture failed, 77 no CUDA device (nothing run).
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
say() { echo "gpu-sequence-traces.sh: $*" >&2; }
out="$(mkdir -p "${1:-$repo/target/gpu-sequence-traces}" && cd "${1:-$repo/target/gpu-sequence-traces}" && pwd)" \
  || { say "cannot use ${1:-} as the output directory"; exit 2; }
python="${TORCH_PYTHON:-python3}"
device="${GPUMEM_SEQUENCE_DEVICE:-cuda}"
if [ "$device" != cpu ] && ! "$python" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  say "$python: torch sees no CUDA device; nothing captured"
  exit 77
fi
configs="$repo/testdata/plan/configs"
capture() {
  local name="$1" site="$2"
  shift 2
  say "capturing $name"
  if PYTHONPATH="$site${site:+:}$repo/tools/src" "$python" -m gpumem_devtools.capture_trace \
      --device "$device" --out-dir "$out" --name "$name-$device" "$@" >"$out/$name.log" 2>&1; then
    tail -n 1 "$out/$name.log"
  else
    say "$name failed: see $out/$name.log"
    failed=1
  fi
}
failed=0
old_site=""
if [ -n "${GPUMEM_OLD_WHEELS:-}" ]; then
  old_site="$out/old-site"
  "$python" -m pip install -q --no-deps --no-index --upgrade --target "$old_site" \
    "$GPUMEM_OLD_WHEELS"/*.whl || { say "cannot install the wheels of $GPUMEM_OLD_WHEELS"; exit 1; }
fi
capture llama2-2l-train-b6-s2048-bf16-sdpa-ckpt-lora64-hold "$old_site" \
  --config "$repo/testdata/traces/sequence/configs/llama2-2l.json" --batch 6 --seq 2048 \
  --dtype bf16 --attn sdpa --grad-ckpt --lora-rank 64 \
  --lora-targets q_proj,k_proj,v_proj,gate_proj,up_proj,down_proj --lora-dropout 0.1 \
  --hold-outputs --steps 2
capture vit-2l-train-b16-img224-fp32-sdpa "" --config "$configs/vit-2l.json" --batch 16 \
  --image-size 224 --attn sdpa --steps 2
capture clip-vision-4l-infer-b16-img224-fp32-sdpa "" --config "$configs/clip-vision-4l.json" \
  --mode infer --batch 16 --image-size 224 --attn sdpa --steps 2
capture qwen2.5-2l-train-b2-s512-bf16-sdpa-loss-none "" --config "$configs/qwen2.5-2l.json" \
  --batch 2 --seq 512 --dtype bf16 --attn sdpa --loss none --optimizer none --steps 2
say "traces in $out; compare: GPUMEM_EXTRA_TRACES=\$(ls -d $out/*.jsonl.gz | paste -sd,) cargo test --release -p gpumem-replay --test planned planned_reserved -- --nocapture"
exit "$failed"
