"""Measure the per-rank peak allocated bytes of real FSDP training steps on CPU, or on one GPU.

FSDP1 (`FullyShardedDataParallel`, each decoder layer wrapped by `ModuleWrapPolicy`,
`use_orig_params=True`) or FSDP2 (`fully_shard` on each decoder layer, then the root), in
fp32 or with mixed precision (`param_dtype` bf16/fp16, `reduce_dtype` fp32), with a sharding
strategy (FULL_SHARD by default; SHARD_GRAD_OP and NO_SHARD for FSDP1;
`reshard_after_forward=False` for FSDP2), over `ws` gloo ranks: one process per rank, each recording its allocations with the CPU recorder of
`gpumem-measure-peak` (recorder.py); the peak is that of training step 2 of 2, the larger
rank's. Results: testdata/plan/measured_distributed.jsonl (keys = `gpumem plan` flags).
CPU cannot show what CUDA streams and NCCL add (docs/plan.md "Distributed training").
`--traces DIR` also writes each case's rank-0 allocation trace there (gpumem-trace v1, the
case's settings and config in its header), for `GPUMEM_EXTRA_TRACES` or the committed
sequence traces.

`--device cuda` runs the GPU grid (`gpu_grid`: Llama-2-7B and 70B blocks at 2048 tokens,
LoRA, QLoRA and parameter offload) on one GPU: rank 0 of each case in a process of its own,
PyTorch's fake process group standing in for the other ranks (its collectives do nothing, so
every buffer FSDP makes for them is made, on FSDP's own CUDA streams, while NCCL is never
initialised: its buffers are not in these figures). Each row adds the step's
`torch.cuda.max_memory_reserved`. Results: testdata/plan/measured_cuda_distributed.jsonl, or
`--out FILE`. `--fake` runs a CPU case the same way (one process, no gloo), which differs
from the gloo run only by gloo's copies of each all-gather's output.

Usage (inside the gpumem checkout, with the [torch] extra):
  python -m gpumem_devtools.measure_distributed --list
  python -m gpumem_devtools.measure_distributed --only 'tinyllama-2l'
  python -m gpumem_devtools.measure_distributed --only 'llama2-3l.*nf4' --redo --traces /tmp/t
  python -m gpumem_devtools.measure_distributed --device cuda --out /tmp/fsdp.jsonl
"""

import argparse
import contextlib
import json
import os
import socket
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import configs
from ._cli import device as device_name
from ._cli import NO_DEVICE, fail, regex
from ._deps import MissingDependency, require
from .measure_peak import run_record
from .paths import repo_root

PROG = "python -m gpumem_devtools.measure_distributed"
OUT = "testdata/plan/measured_distributed.jsonl"
#: Where `--device cuda` writes by default.
CUDA_OUT = "testdata/plan/measured_cuda_distributed.jsonl"
CONFIG_DIR = "testdata/plan/configs"
STEPS = 2
#: The LoRA cases' adapter dropout (PEFT's FSDP QLoRA example's 0.1).
LORA_DROPOUT = 0.1


@dataclass(frozen=True)
class Case:
    """One FSDP training run."""
    config: str
    version: int
    mp: str | None
    batch: int
    seq: int
    grad_ckpt: bool = False
    ranks: int = 2
    #: `gpumem plan --fsdp-sharding`: full_shard, shard_grad_op or no_shard.
    sharding: str = "full_shard"
    #: Micro-batches a step accumulates, all but the last under FSDP1's `no_sync()`.
    grad_accum: int = 1
    #: The model's dtype (`gpumem plan --dtype`): fp32, or bf16 under LoRA.
    dtype: str = "fp32"
    #: PEFT LoRA of this rank on every linear (dropout `LORA_DROPOUT`), wrapped as PEFT's FSDP
    #: recipes wrap it (FSDP1, `fsdp_auto_wrap_policy`, `use_orig_params=False`).
    lora_rank: int | None = None
    #: A bitsandbytes 4-bit base under the LoRA adapters (`gpumem plan --quant`: nf4 or
    #: nf4:double), as PEFT's FSDP QLoRA example and fsdp_qlora build it.
    quant: str | None = None
    #: FSDP1's `CPUOffload(offload_params=True)`: the shards and their gradients on the host
    #: (`gpumem plan --offload`); on a GPU only.
    offload: bool = False

    def __post_init__(self) -> None:
        if self.grad_accum > 1 and self.version != 1:
            raise ValueError("gradient accumulation is measured under FSDP1's no_sync() only")
        if self.lora_rank is not None and (self.version != 1 or self.mp is not None):
            raise ValueError("LoRA is measured as PEFT's FSDP1 recipes run it (no FSDP mixed "
                             "precision: a half-precision model)")
        if self.quant is not None and (self.lora_rank is None or self.dtype != "bf16"):
            raise ValueError("a 4-bit base is measured under LoRA adapters in a bf16 model "
                             "(bf16 quant_storage), as QLoRA recipes run it")
        if self.offload and self.version != 1:
            raise ValueError("parameter offload is measured under FSDP1's CPUOffload only")

    @property
    def id(self) -> str:
        ckpt = "-ckpt" if self.grad_ckpt else ""
        shard = "" if self.sharding == "full_shard" else "-" + self.sharding.replace("_", "-")
        accum = f"-accum{self.grad_accum}" if self.grad_accum > 1 else ""
        lora = f"-lora{self.lora_rank}" if self.lora_rank is not None else ""
        if self.quant is not None:
            lora = f"-{self.quant.replace(':', '-')}{lora}"
        if self.offload:
            lora += "-offload"
        return (f"{self.config}-train-b{self.batch}-s{self.seq}-fsdp{self.version}-"
                f"{self.mp or self.dtype}{ckpt}{shard}{accum}{lora}-gpus{self.ranks}")

    def settings(self) -> dict[str, Any]:
        s: dict[str, Any] = {"mode": "train", "batch": self.batch, "seq": self.seq,
                             "dtype": self.dtype, "optimizer": "adamw", "optimizer_impl": "foreach",
                             "attn": "sdpa", "gpus": self.ranks, "fsdp": True,
                             "fsdp_version": str(self.version)}
        if self.mp:
            s["fsdp_mp"] = self.mp
        if self.grad_ckpt:
            s["grad_ckpt"] = True
        if self.sharding != "full_shard":
            s["fsdp_sharding"] = self.sharding
        if self.grad_accum > 1:
            s["grad_accum"] = self.grad_accum
        if self.lora_rank is not None:
            s.update(lora_rank=self.lora_rank, lora_targets="all-linear",
                     lora_dropout=LORA_DROPOUT)
        if self.quant is not None:
            s["quant"] = self.quant
        if self.offload:
            s["offload"] = True
        return s


def grid() -> list[Case]:
    """Every case, in file order."""
    cases = [Case(cfg, v, mp, b, s)
             for cfg in ("tinyllama-2l", "gpt2-2l") for v in (2, 1) for mp in (None, "bf16")
             for b, s in ((2, 256), (4, 512))]
    cases += [Case(cfg, v, mp, 1, 128)
              for cfg in ("tinyllama-8l", "gpt2-12l") for v in (2, 1) for mp in (None, "bf16")]
    cases += [Case("tinyllama-8l", 2, "bf16", 2, 256, True), Case("tinyllama-8l", 1, "bf16", 2, 256, True),
              Case("gpt2-12l", 2, None, 2, 256, True),
              Case("tinyllama-8l", 2, None, 1, 128, ranks=4),
              Case("tinyllama-8l", 2, "bf16", 1, 128, ranks=4),
              Case("tinyllama-8l", 1, None, 1, 128, ranks=4),
              Case("llama-8l", 2, "bf16", 1, 256), Case("qwen2.5-6l", 2, "bf16", 2, 256)]
    # Sharding strategies other than FULL_SHARD (FSDP2 has no NO_SHARD).
    cases += [Case(cfg, v, None, 1, 128, sharding=sh)
              for cfg in ("tinyllama-8l", "gpt2-12l") for v in (1, 2)
              for sh in ("shard_grad_op", "no_shard") if (v, sh) != (2, "no_shard")]
    # Llama-8l's blocks outweigh its root (vocabulary 4096), so where the blocks' gathered
    # parameters live shows in the peak; FULL_SHARD beside each strategy.
    cases += [Case("llama-8l", v, None, 1, 128, sharding=sh) for v in (1, 2)
              for sh in ("full_shard", "shard_grad_op", "no_shard") if (v, sh) != (2, "no_shard")]
    cases += [Case("llama-8l", 1, "bf16", 4, 512, True, sharding=sh)
              for sh in ("full_shard", "shard_grad_op", "no_shard")]
    cases += [Case("llama-8l", 2, "bf16", 4, 512, True, sharding="shard_grad_op")]
    # Accumulating two micro-batches, the first under no_sync (FSDP1).
    cases += [Case("llama-8l", 1, None, 1, 128, sharding=sh, grad_accum=2)
              for sh in ("full_shard", "shard_grad_op")]
    # PEFT LoRA as PEFT's and philschmid's FSDP recipes run it: a bf16 model, FSDP1 wrapping
    # each adapter as its own unit with use_orig_params=False, with and without checkpointing.
    cases += [Case("llama-8l", 1, None, 4, 512, ckpt, dtype="bf16", lora_rank=8)
              for ckpt in (True, False)]
    # And QLoRA (NF4, double quantisation), and both over three of Llama-2-7B's blocks, whose
    # gathered block outweighs a step's activations at 2 x 512 tokens: where FSDP1 gathers the
    # block before shows in the peak.
    cases += [Case("llama-8l", 1, None, 4, 512, True, dtype="bf16", lora_rank=8,
                   quant="nf4:double")]
    cases += [Case("llama2-3l", 1, None, 2, 512, True, dtype="bf16", lora_rank=8, quant=q)
              for q in (None, "nf4:double")]
    return cases


def gpu_grid() -> list[Case]:
    """The cases `--device cuda` runs, at the scale of the published FSDP rows: PEFT LoRA and
    QLoRA over Llama-2-7B's and Llama-2-70B's blocks at 2 x 2048 tokens with checkpointing,
    QLoRA with parameter offload, and FSDP1 wrapping the blocks alone (bf16 mixed precision),
    where a resharded block waits for its free event in the unshard pool."""
    cases = [Case("llama2-3l", 1, None, 2, 2048, True, dtype="bf16", lora_rank=8, quant=q)
             for q in (None, "nf4:double")]
    cases += [Case("llama2-70b-2l", 1, None, 2, 2048, True, dtype="bf16", lora_rank=8,
                   quant="nf4:double", offload=offload) for offload in (False, True)]
    cases += [Case("llama2-3l", 1, "bf16", 2, 2048, True)]
    return cases


def _worker(rank: int, case: Case, config_path: str, port: int, out: str,
            trace: str | None, device: str, fake: bool) -> None:
    import torch
    import torch.distributed as dist

    from .models import (build, decoder_layers, gpu_like_dropout, gpu_like_softmax,
                         make_optimizer)
    from .recorder import recorder_for
    from .workloads import four_bit_base, with_lora

    torch.set_num_threads(1)
    if fake:
        # Rank 0 alone: the fake group's collectives return at once, the other ranks' shards
        # are never sent, and everything FSDP allocates for them is allocated.
        from torch.testing._internal.distributed.fake_pg import FakeStore
        dist.init_process_group("fake", rank=0, world_size=case.ranks, store=FakeStore())
    else:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=case.ranks)
    on_gpu = torch.device(device).type == "cuda"
    if on_gpu:
        torch.cuda.set_device(torch.device(device))
    torch.manual_seed(0)
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}
    rec = recorder_for(device)
    with gpu_like_dropout(device), gpu_like_softmax(device), rec:
        wl = build(config_path, case.dtype, "sdpa", case.grad_ckpt, device)
        model = wl.model
        layers = decoder_layers(model)
        if case.quant is not None:
            four_bit_base(model, case.quant == "nf4:double")
            # FSDP1 flattens the packed weights and keeps no QuantState: bitsandbytes reads
            # the module's own (`Linear4bit.quant_state`, which fsdp_qlora sets too).
            for module in model.modules():
                if isinstance(module, require("bitsandbytes").nn.Linear4bit):
                    module.quant_state = module.weight.quant_state
        if case.lora_rank is not None:
            model = with_lora(model, case.lora_rank, None, LORA_DROPOUT)
        if case.version == 2:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
            kw: dict[str, Any] = {}
            if case.mp:
                kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=half[case.mp],
                                                       reduce_dtype=torch.float32)
            for layer in layers:
                fully_shard(layer, reshard_after_forward=case.sharding != "shard_grad_op", **kw)
            fully_shard(model, **kw)
        else:
            from torch.distributed.fsdp import (CPUOffload, FullyShardedDataParallel,
                                                MixedPrecision, ShardingStrategy)
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy
            kw = {"sharding_strategy": ShardingStrategy[case.sharding.upper()]}
            if case.mp:
                kw["mixed_precision"] = MixedPrecision(param_dtype=half[case.mp],
                                                       reduce_dtype=torch.float32,
                                                       buffer_dtype=half[case.mp])
            if case.offload:
                kw["cpu_offload"] = CPUOffload(offload_params=True)
            if case.lora_rank is not None:
                # PEFT's recipes: each adapter a unit of its own beside the decoder layers,
                # flat parameters (use_orig_params=False) of one requires_grad each.
                policy = require("peft").utils.other.fsdp_auto_wrap_policy(model)
            else:
                policy = ModuleWrapPolicy({type(layers[0])})
            model = FullyShardedDataParallel(
                model, auto_wrap_policy=policy, device_id=torch.device(device),
                use_orig_params=case.lora_rank is None, **kw)
        wl.model = model
        opt = make_optimizer("adamw", "foreach", model.parameters())
        model.train()
        for _ in range(STEPS):
            if on_gpu:
                torch.cuda.reset_peak_memory_stats()
            rec.boundary("step")
            # The model's inputs live where its first unit computes (the host's with offload
            # are copied by FSDP).
            inputs = wl.batch(case.batch, case.seq, device, torch.float32, with_labels=True)
            for micro in range(case.grad_accum):
                rec.boundary("forward")
                last = micro == case.grad_accum - 1
                with contextlib.nullcontext() if last else model.no_sync():
                    loss = wl.loss(**inputs)
                    rec.boundary("backward")
                    loss.backward()
            rec.boundary("optimizer")
            opt.step()
            rec.boundary("zero_grad")
            opt.zero_grad(set_to_none=True)
            del loss, inputs
        rec.boundary("end")
    # The last step's reserved peak (a GPU's caching allocator; none on the CPU).
    reserved = torch.cuda.max_memory_reserved() if on_gpu else None
    tl = rec.timeline()
    start, end = tl.boundary_times("step")[-1], tl.boundary_times("end")[-1]
    peak, t = tl.peak_between(start, end)
    Path(f"{out}.{rank}").write_text(json.dumps([peak, tl.phase_at(t), reserved]))
    if trace is not None and rank == 0:
        from . import tracefile
        events, stats = tracefile.window(tl)
        meta = {"config": f"{CONFIG_DIR}/{case.config}.json", "device": device,
                "steps": STEPS, "torch": torch.__version__, **case.settings(), **stats}
        tracefile.write(Path(trace) / f"{case.id}.jsonl.gz", case.id, rec.source, meta, events)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Measured:
    """What one case's ranks measured."""
    #: Each rank's peak allocated bytes over the last step (rank 0's alone on a fake group).
    per_rank: list[int]
    #: The phase of the largest.
    phase: str | None
    #: The largest rank's `max_memory_reserved` over the last step (GPU runs only).
    reserved: int | None


def measure(case: Case, config_path: Path, trace: Path | None = None,
            device: str = "cpu", fake: bool = False) -> Measured:
    """Run `case` on `device`: its ranks over gloo, or rank 0 alone on PyTorch's fake process
    group (`fake`, always on a GPU), each in a process of its own; rank 0's trace into
    `trace`, a folder."""
    import torch.multiprocessing as mp

    fake = fake or device != "cpu"
    processes = 1 if fake else case.ranks
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank")
        mp.spawn(_worker, args=(case, str(config_path), _free_port(), out,
                                None if trace is None else str(trace), device, fake),
                 nprocs=processes, join=True)
        results = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(processes)]
    peaks = [int(p) for p, _, _ in results]
    largest = results[peaks.index(max(peaks))]
    return Measured(peaks, largest[1], largest[2])


def _notes(case: Case, device: str = "cpu", fake: bool = False) -> str:
    if case.version == 2:
        wrap = "fully_shard on each decoder layer and the root"
    elif case.lora_rank is not None:
        base = case.dtype
        if case.quant is not None:
            base += (f" model whose decoder linears are bitsandbytes Linear4bit ({case.quant}, "
                     "bf16 quant_storage, the module's quant_state set)")
        wrap = (f"a {base} model with PEFT LoRA r={case.lora_rank} on every linear "
                f"(dropout {LORA_DROPOUT}, fp32 adapters), FullyShardedDataParallel with PEFT's "
                "fsdp_auto_wrap_policy (each adapter its own unit), use_orig_params=False")
    else:
        wrap = "FullyShardedDataParallel, ModuleWrapPolicy(decoder layer), use_orig_params=True"
    if case.mp:
        wrap += f", param_dtype={case.mp}, reduce_dtype=float32"
    if case.sharding == "shard_grad_op" and case.version == 2:
        wrap += ", reshard_after_forward=False on each decoder layer"
    elif case.sharding != "full_shard":
        wrap += f", sharding_strategy {case.sharding.upper()}"
    if case.grad_accum > 1:
        wrap += f", {case.grad_accum} micro-batches per step, all but the last under no_sync()"
    if case.offload:
        wrap += ", CPUOffload(offload_params=True)"
    if device == "cpu" and not fake:
        return (f"torch.distributed gloo, world size {case.ranks} on CPU, one process per rank, "
                f"1 thread each; torch.profiler CPU allocation trace per rank; peak over train "
                f"step {STEPS} of {STEPS}, the larger rank's; {wrap}; AdamW foreach; "
                f"zero_grad(set_to_none=True); dropout via native_dropout")
    recorded = ("torch.profiler CPU allocation trace" if device == "cpu" else
                "torch.cuda.memory._record_memory_history, max_memory_reserved")
    return (f"rank 0 of world size {case.ranks} alone on {device} over PyTorch's fake process "
            f"group (collectives do nothing; NCCL not initialised); {recorded}; peak over "
            f"train step {STEPS} of {STEPS}; {wrap}; AdamW foreach; zero_grad(set_to_none=True)"
            + ("; dropout via native_dropout" if device == "cpu" else ""))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG,
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", type=regex, help="cases whose id matches this regex")
    parser.add_argument("--list", action="store_true", help="print the case ids and exit")
    parser.add_argument("--redo", action="store_true",
                        help="re-measure cases already in the file (their rows are replaced)")
    parser.add_argument("--repo", type=Path, help="the gpumem checkout [default: the one here]")
    parser.add_argument("--traces", type=Path,
                        help="also write each case's rank-0 allocation trace into this folder")
    parser.add_argument("--device", type=device_name, default="cpu",
                        help="cpu (the CPU grid over gloo ranks) or cuda[:N] (the GPU grid, "
                        "rank 0 on PyTorch's fake process group) [default: cpu]")
    parser.add_argument("--fake", action="store_true",
                        help="on the CPU too, rank 0 alone on the fake process group")
    parser.add_argument("--out", type=Path,
                        help=f"the results file [default: {OUT}, {CUDA_OUT} with --device cuda]")
    args = parser.parse_args(argv)
    on_gpu = args.device != "cpu"
    table = gpu_grid() if on_gpu else grid()
    cases = [c for c in table if args.only is None or args.only.search(c.id)]
    if args.list:
        print("\n".join(c.id for c in cases))
        return 0
    try:
        torch = require("torch")
        transformers = require("transformers")
        root = repo_root(args.repo)
        if on_gpu and not torch.cuda.is_available():
            print(f"{PROG}: --device {args.device}: PyTorch {torch.__version__} sees no CUDA "
                  "device; nothing measured", file=sys.stderr)
            return NO_DEVICE
    except (MissingDependency, ValueError) as err:
        return fail(PROG, err)
    out_path = args.out or root / (CUDA_OUT if on_gpu else OUT)
    rows: dict[str, dict[str, Any]] = {}
    if out_path.exists():
        lines = [line for line in out_path.read_text().splitlines() if line]
        rows = {r["id"]: r for r in map(json.loads, lines)}
    import platform
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "python": platform.python_version()}
    cases = [c for c in cases if args.redo or c.id not in rows]
    configs.write_configs(root / CONFIG_DIR, sorted({c.config for c in cases}))
    if args.traces is not None:
        args.traces.mkdir(parents=True, exist_ok=True)
    order = {c.id: i for i, c in enumerate(table)}
    for case in cases:
        config = f"{CONFIG_DIR}/{case.config}.json"
        got = measure(case, root / config, args.traces, args.device, args.fake)
        # The libraries whose code the step ran, beside PyTorch's and transformers'.
        extra = {"peft": case.lora_rank, "bitsandbytes": case.quant}
        used = {name: require(name).__version__ for name, on in extra.items() if on}
        measured: dict[str, Any] = {"peak_allocated_bytes": max(got.per_rank),
                                    "phase": got.phase, "per_rank": got.per_rank}
        if got.reserved is not None:
            measured["peak_reserved_bytes"] = got.reserved
        rows[case.id] = {"id": case.id, "config": config, "settings": case.settings(),
                         "measured": measured, "versions": {**versions, **used},
                         "run": run_record(args.device),
                         "notes": _notes(case, args.device, args.fake)}
        # A re-measured case replaces its row; the file keeps the grid's order.
        ordered = sorted(rows.values(), key=lambda r: order.get(r["id"], len(order)))
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text("".join(json.dumps(r) + "\n" for r in ordered))
        print(case.id, got.per_rank, got.phase, got.reserved, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
