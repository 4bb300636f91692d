"""Measure what a CUDA process holds outside PyTorch's caching allocator, stage by stage.

nvidia-smi (NVML) shows a training process's memory as PyTorch's reserved memory plus what
lives outside its pool: the CUDA context with the kernels loaded so far, the cuBLAS and cuDNN
handles, NCCL's communicators, other libraries' modules. `gpumem plan` counts that as the
`framework` entry (`--context-mib`, default 500) and NCCL's memory (`communication`); the
published figures read from nvidia-smi are compared with reserved + those. This measures it on
a real GPU: after each stage, the device memory in use (cudaMemGetInfo's total - free, the whole
device's: run it alone on the GPU) less `torch.cuda.memory_reserved()`.

Stages, run once each in this order (each adds to what the earlier ones loaded):
  context       torch.zeros(1) on the device: the primary context and PyTorch's first kernel
  cublas        bf16 and fp32 matmuls, forward and backward (cuBLAS and cuBLASLt handles;
                their workspaces are in PyTorch's pool)
  sdpa          F.scaled_dot_product_attention forward and backward in bf16 and fp32
  cudnn         a conv2d forward and backward in fp32 and bf16 (cuDNN's handle and engines)
  training      a small Llama-shaped training step (RMSNorm, rotary, SiLU, cross-entropy,
                AdamW foreach): the kernels a real step loads, where transformers imports
  nccl          a one-rank NCCL process group and an all_reduce (NCCL's kernels and its
                communicator; a one-rank group has no peers, so no per-peer buffers)
  bitsandbytes  an NF4 4-bit matmul forward and backward, where bitsandbytes imports
  flash_attn    flash_attn_func forward and backward, where flash_attn imports

Output: JSON lines, a header {"run" (the GPU, its memory, driver and CUDA version and the date,
as the measured sets record them), "versions", "device_total_bytes"} then one line
per stage {"stage", "outside_pool_bytes", "reserved_bytes", "device_used_bytes", "seconds"}
(a stage whose library is missing: {"stage", "skipped": why}). Needs the [torch] extra and a
CUDA device; exit status 77 when PyTorch sees none (nothing measured).

Usage (on the GPU machine):
  gpumem-measure-context --out target/context.jsonl
  gpumem-measure-context --stages context,cublas,nccl
"""

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ._cli import NO_DEVICE, device, device_type, fail
from ._deps import MissingDependency, require

PROG = "gpumem-measure-context"


def _context(torch: Any, dev: str) -> None:
    torch.zeros(1, device=dev)


def _cublas(torch: Any, dev: str) -> None:
    for dtype in (torch.bfloat16, torch.float32):
        a = torch.randn(512, 1024, device=dev, dtype=dtype, requires_grad=True)
        w = torch.randn(1024, 1024, device=dev, dtype=dtype, requires_grad=True)
        (a @ w).sum().backward()


def _sdpa(torch: Any, dev: str) -> None:
    F = torch.nn.functional
    for dtype in (torch.bfloat16, torch.float32):
        q, k, v = (torch.randn(2, 8, 256, 64, device=dev, dtype=dtype, requires_grad=True)
                   for _ in range(3))
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()


def _cudnn(torch: Any, dev: str) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        conv = torch.nn.Conv2d(3, 64, 7, stride=2, padding=3).to(dev, dtype)
        conv(torch.randn(8, 3, 224, 224, device=dev, dtype=dtype)).sum().backward()


def _training(torch: Any, dev: str) -> None:
    transformers = require("transformers")
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4,
                                   vocab_size=1024, max_position_embeddings=512)
    model = transformers.LlamaForCausalLM(cfg).to(dev, torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    ids = torch.randint(0, 1024, (2, 128), device=dev)
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _nccl(torch: Any, dev: str) -> None:
    dist = require("torch.distributed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    device_id = torch.device(dev)
    if device_id.index is None:  # init_process_group wants the device's index
        device_id = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=device_id)
    t = torch.ones(1 << 20, device=dev)
    dist.all_reduce(t)
    torch.cuda.synchronize(dev)


def _bitsandbytes(torch: Any, dev: str) -> None:
    bnb = require("bitsandbytes")
    layer = bnb.nn.Linear4bit(1024, 1024, bias=False, compute_dtype=torch.bfloat16,
                              quant_type="nf4").to(dev)
    x = torch.randn(512, 1024, device=dev, dtype=torch.bfloat16, requires_grad=True)
    layer(x).sum().backward()


def _flash_attn(torch: Any, dev: str) -> None:
    flash_attn = require("flash_attn")
    q, k, v = (torch.randn(2, 256, 8, 64, device=dev, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    flash_attn.flash_attn_func(q, k, v, causal=True).sum().backward()


STAGES: dict[str, Callable[[Any, str], None]] = {
    "context": _context, "cublas": _cublas, "sdpa": _sdpa, "cudnn": _cudnn,
    "training": _training, "nccl": _nccl, "bitsandbytes": _bitsandbytes,
    "flash_attn": _flash_attn,
}
# Stages whose library a CUDA PyTorch may lack (transformers, bitsandbytes, flash-attn):
# measured where it imports, else skipped.
OPTIONAL = ("training", "bitsandbytes", "flash_attn")


def stage_list(text: str) -> list[str]:
    """argparse type: comma-separated stage names, in the order `STAGES` runs them."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in STAGES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown stage {', '.join(unknown) or '(none given)'}; accepted: "
            f"{', '.join(STAGES)}")
    return [n for n in STAGES if n in names]


def outside_pool(used: int, reserved: int) -> int:
    """Bytes the device has in use beyond PyTorch's pool (never negative: another process
    freeing memory between the two readings must not show as a negative context)."""
    return max(used - reserved, 0)


def measure(stages: Sequence[str], dev: str) -> list[dict[str, Any]]:
    """One row per stage, in order (see the module's comment)."""
    torch = require("torch")
    rows: list[dict[str, Any]] = []
    for name in stages:
        t0 = time.time()
        try:
            STAGES[name](torch, dev)
        except MissingDependency as err:
            if name not in OPTIONAL:
                raise
            rows.append({"stage": name, "skipped": str(err)})
            continue
        torch.cuda.synchronize(dev)
        free, total = torch.cuda.mem_get_info(dev)
        reserved = torch.cuda.memory_reserved(dev)
        rows.append({"stage": name, "outside_pool_bytes": outside_pool(total - free, reserved),
                     "reserved_bytes": reserved, "device_used_bytes": total - free,
                     "seconds": round(time.time() - t0, 2)})
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()  # the nccl stage's, measured above
    return rows


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None,
                    help="write the JSON lines here too (default: standard output only)")
    ap.add_argument("--device", type=device, default="cuda",
                    help="cuda (default) or cuda:N; run alone on that GPU")
    ap.add_argument("--stages", type=stage_list, default=list(STAGES),
                    help=f"comma-separated, from: {', '.join(STAGES)} (default: all)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if device_type(args.device) != "cuda":
        ap.error(f"--device {args.device}: this measures a CUDA process; use cuda or cuda:N")
    try:
        torch = require("torch")
        if not torch.cuda.is_available():
            print(f"{PROG}: PyTorch sees no CUDA device; nothing measured", file=sys.stderr)
            return NO_DEVICE
        from .measure_peak import run_record, versions

        free, total = torch.cuda.mem_get_info(args.device)
        header = {"run": run_record(args.device), "versions": versions(),
                  "device_total_bytes": total, "device_used_before_bytes": total - free}
        rows = measure(args.stages, args.device)
    except (MissingDependency, RuntimeError, ValueError) as err:
        return fail(PROG, err)
    lines = [json.dumps(header)] + [json.dumps(r) for r in rows]
    print("\n".join(lines))
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
