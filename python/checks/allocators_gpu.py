"""PyTorch's CUDA allocators and gpumem's pool under real training and serving, on an NVIDIA
GPU (scripts/gpu-allocators.sh runs it, from scripts/gpu-check.sh; docs/gpu.md keeps the record).

Four workloads: a Llama-shaped decoder (~400 M parameters) trained under bf16 autocast; GPT-2
fine-tuned with a new sequence length every step; the Llama shape in bf16 serving
generate-style requests with a KV cache; ResNet-50 training. Each runs under six allocators,
every run in a fresh process that picks its allocator before CUDA starts: PyTorch's caching
allocator as shipped (``pytorch``), with ``expandable_segments:True``, with
``backend:cudaMallocAsync``; gpumem's pool (``gpumem.torch.use()``) with its ``torch``,
``expandable`` and ``gpumem`` policies. Two repetitions, interleaved: every run once, then
every run again in the same order.

Per run: every step time, peak reserved and allocated, the per-step losses, the error if
any; gpumem's runs also write the pool's snapshot, and ``gpumem replay SNAPSHOT --policy
<same>`` must give the run's peak reserved to the byte. Each workload then runs briefly under
``compute-sanitizer --tool memcheck`` on the ``gpumem`` policy.

Prints ``test NAME ... ok|FAILED|ignored`` lines (scripts/gpu-check.sh tables them) and a
markdown table; everything goes to ``--out`` as JSON. ``--dry-run`` runs the same
orchestration on the CPU with tiny models (no gpumem pool there, reserved not measured) to
check the logic where there is no GPU. torch is imported only by the functions that run a
workload: the schedule, verdicts and table load without it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import glob
import hashlib
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, NamedTuple

GIB = 1 << 30
# Every allocation event of a run is kept for its snapshot (a serving run makes about 0.4 M).
HISTORY_EVENTS = 4_000_000
ALLOCATORS: dict[str, dict[str, str]] = {
    "pytorch": {},
    "pytorch-expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "pytorch-async": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
    "gpumem-torch": {"GPUMEM_POOL": "torch"},
    "gpumem-expandable": {"GPUMEM_POOL": "expandable"},
    "gpumem-gpumem": {"GPUMEM_POOL": "gpumem"},
}
REFERENCE = "pytorch"
GPUMEM = "gpumem-gpumem"
WORKLOADS = ("llama-train", "gpt2-varlen", "llama-serve", "resnet50-train")
SERVING = "llama-serve"
VARLEN = "gpt2-varlen"
# Inherited settings that would change what an allocator does: each child gets only its own.
ALLOCATOR_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "GPUMEM_POOL",
                       "GPUMEM_SOFT_LIMIT", "GPUMEM_HARD_LIMIT", "GPUMEM_HISTORY",
                       "GPUMEM_POLICY_CONF")
# The time a workload's first run is assumed to take, before one has been measured.
FIRST_RUN_ESTIMATE_S = 30.0


@dataclasses.dataclass(frozen=True)
class LlamaShape:
    """A Llama-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU, untied head."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int


@dataclasses.dataclass(frozen=True)
class Gpt2Shape:
    """A GPT-2 decoder: LayerNorm, learned positions, GELU MLP, head tied to the embedding."""

    hidden: int
    layers: int
    heads: int
    vocab: int
    context: int


@dataclasses.dataclass(frozen=True)
class Scale:
    """The sizes of one kind of run: on the GPU, under the sanitizer, or the CPU dry run.
    Ranges are inclusive ``(low, high)``."""

    warmup: int
    steps: int
    serve_warmup: int
    requests: int
    llama: LlamaShape
    llama_batch: int
    llama_seq: int
    gpt2: Gpt2Shape
    gpt2_tokens: int
    gpt2_seq: tuple[int, int]
    serve_batch: tuple[int, int]
    serve_prompt: tuple[int, int]
    serve_new: tuple[int, int]
    resnet_batch: int
    resnet_image: int


SCALES: dict[str, Scale] = {
    "gpu": Scale(warmup=5, steps=20, serve_warmup=2, requests=12,
                 llama=LlamaShape(1536, 12, 12, 4, 4096, 32000), llama_batch=8, llama_seq=1024,
                 gpt2=Gpt2Shape(768, 12, 12, 50257, 1024), gpt2_tokens=8192,
                 gpt2_seq=(128, 1024), serve_batch=(1, 8), serve_prompt=(64, 1024),
                 serve_new=(8, 64), resnet_batch=64, resnet_image=224),
    # The same layer shapes, two layers deep, small batches: memcheck is slow.
    "sanitizer": Scale(warmup=1, steps=1, serve_warmup=0, requests=2,
                       llama=LlamaShape(1536, 2, 12, 4, 4096, 32000), llama_batch=1,
                       llama_seq=128, gpt2=Gpt2Shape(768, 2, 12, 50257, 1024), gpt2_tokens=512,
                       gpt2_seq=(128, 256), serve_batch=(1, 2), serve_prompt=(16, 64),
                       serve_new=(2, 4), resnet_batch=2, resnet_image=64),
    "dry": Scale(warmup=1, steps=3, serve_warmup=1, requests=3,
                 llama=LlamaShape(64, 2, 4, 2, 128, 256), llama_batch=2, llama_seq=32,
                 gpt2=Gpt2Shape(64, 2, 4, 256, 128), gpt2_tokens=256, gpt2_seq=(16, 128),
                 serve_batch=(1, 3), serve_prompt=(4, 24), serve_new=(2, 6), resnet_batch=2,
                 resnet_image=32),
}


class Verdict(NamedTuple):
    """One ``test NAME ... ok|FAILED|ignored`` line: ok is None when it could not be decided."""

    name: str
    ok: bool | None
    detail: str


# ---------------------------------------------------------------------------------------------
# The schedule: the same inputs in every process.


def schedule(workload: str, scale: Scale) -> list[dict[str, int]]:
    """Every step's inputs (serving: every request's), warm-up first. A fixed generator per
    workload makes the list identical in every process and on every call."""
    rng = random.Random(f"gpumem-allocators:{workload}")
    if workload == SERVING:
        return [{"seed": rng.randrange(1 << 31), "batch": rng.randint(*scale.serve_batch),
                 "prompt": rng.randint(*scale.serve_prompt), "new": rng.randint(*scale.serve_new)}
                for _ in range(scale.serve_warmup + scale.requests)]
    steps = []
    for _ in range(scale.warmup + scale.steps):
        seed = rng.randrange(1 << 31)
        if workload == VARLEN:
            seq = rng.randint(*scale.gpt2_seq)
            steps.append({"seed": seed, "batch": scale.gpt2_tokens // seq, "seq": seq})
        elif workload == "llama-train":
            steps.append({"seed": seed, "batch": scale.llama_batch, "seq": scale.llama_seq})
        else:
            steps.append({"seed": seed, "batch": scale.resnet_batch, "image": scale.resnet_image})
    return steps


def warmup_of(workload: str, scale: Scale) -> int:
    """How many of the workload's scheduled steps are untimed."""
    return scale.serve_warmup if workload == SERVING else scale.warmup


def plan_runs(workloads: list[str], allocators: list[str], reps: int) -> list[tuple[int, str, str]]:
    """(rep, workload, allocator) in run order: every run of a repetition before the next
    repetition begins, so that drift over time touches every allocator alike."""
    return [(rep, w, a) for rep in range(1, reps + 1) for w in workloads for a in allocators]


# ---------------------------------------------------------------------------------------------
# The workloads (child process; torch is imported here only).


def _models(torch: Any) -> Any:
    """The model classes, defined once torch is imported."""
    nn, F = torch.nn, torch.nn.functional

    def rope(x: Any, cos: Any, sin: Any) -> Any:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), -1)
        return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)

    class RMSNorm(nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x: Any) -> Any:
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
            return self.weight * h.to(x.dtype)

    class LlamaAttention(nn.Module):
        def __init__(self, s: LlamaShape) -> None:
            super().__init__()
            self.heads, self.kv_heads, self.dim = s.heads, s.kv_heads, s.hidden // s.heads
            self.q = nn.Linear(s.hidden, s.heads * self.dim, bias=False)
            self.k = nn.Linear(s.hidden, s.kv_heads * self.dim, bias=False)
            self.v = nn.Linear(s.hidden, s.kv_heads * self.dim, bias=False)
            self.o = nn.Linear(s.heads * self.dim, s.hidden, bias=False)

        def forward(self, x: Any, cos: Any, sin: Any, cache: list | None, index: int) -> Any:
            b, t, _ = x.shape
            q = self.q(x).view(b, t, self.heads, self.dim).transpose(1, 2)
            k = self.k(x).view(b, t, self.kv_heads, self.dim).transpose(1, 2)
            v = self.v(x).view(b, t, self.kv_heads, self.dim).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            if cache is not None:
                if cache[index] is not None:  # a growing cache, as transformers' DynamicCache
                    k = torch.cat((cache[index][0], k), 2)
                    v = torch.cat((cache[index][1], v), 2)
                cache[index] = (k, v)
            group, length = self.heads // self.kv_heads, k.shape[2]
            k = k[:, :, None].expand(b, self.kv_heads, group, length, self.dim).reshape(
                b, self.heads, length, self.dim)
            v = v[:, :, None].expand(b, self.kv_heads, group, length, self.dim).reshape(
                b, self.heads, length, self.dim)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
            return self.o(y.transpose(1, 2).reshape(b, t, -1))

    class LlamaBlock(nn.Module):
        def __init__(self, s: LlamaShape) -> None:
            super().__init__()
            self.norm1, self.norm2 = RMSNorm(s.hidden), RMSNorm(s.hidden)
            self.attn = LlamaAttention(s)
            self.gate = nn.Linear(s.hidden, s.ffn, bias=False)
            self.up = nn.Linear(s.hidden, s.ffn, bias=False)
            self.down = nn.Linear(s.ffn, s.hidden, bias=False)

        def forward(self, x: Any, cos: Any, sin: Any, cache: list | None, index: int) -> Any:
            x = x + self.attn(self.norm1(x), cos, sin, cache, index)
            h = self.norm2(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Llama(nn.Module):
        def __init__(self, s: LlamaShape) -> None:
            super().__init__()
            self.embed = nn.Embedding(s.vocab, s.hidden)
            self.blocks = nn.ModuleList(LlamaBlock(s) for _ in range(s.layers))
            self.norm = RMSNorm(s.hidden)
            self.head = nn.Linear(s.hidden, s.vocab, bias=False)
            dim = s.hidden // s.heads
            inv_freq = 1.0 / 10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
            self.register_buffer("inv_freq", inv_freq, persistent=False)

        def forward(self, ids: Any, cache: list | None = None, start: int = 0,
                    last_only: bool = False) -> Any:
            positions = torch.arange(start, start + ids.shape[1], device=ids.device,
                                     dtype=torch.float32)
            freqs = torch.outer(positions, self.inv_freq)
            angles = torch.cat((freqs, freqs), -1)
            cos, sin = angles.cos(), angles.sin()
            x = self.embed(ids)
            for index, block in enumerate(self.blocks):
                x = block(x, cos, sin, cache, index)
            x = self.norm(x[:, -1:] if last_only else x)
            return self.head(x)

    class Gpt2Block(nn.Module):
        def __init__(self, s: Gpt2Shape) -> None:
            super().__init__()
            self.heads = s.heads
            self.ln1, self.ln2 = nn.LayerNorm(s.hidden), nn.LayerNorm(s.hidden)
            self.qkv = nn.Linear(s.hidden, 3 * s.hidden)
            self.proj = nn.Linear(s.hidden, s.hidden)
            self.fc = nn.Linear(s.hidden, 4 * s.hidden)
            self.out = nn.Linear(4 * s.hidden, s.hidden)

        def forward(self, x: Any) -> Any:
            b, t, d = x.shape
            q, k, v = (part.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                       for part in self.qkv(self.ln1(x)).split(d, -1))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class Gpt2(nn.Module):
        def __init__(self, s: Gpt2Shape) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(s.vocab, s.hidden), nn.Embedding(s.context, s.hidden)
            self.blocks = nn.ModuleList(Gpt2Block(s) for _ in range(s.layers))
            self.ln = nn.LayerNorm(s.hidden)

        def forward(self, ids: Any) -> Any:
            x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
            for block in self.blocks:
                x = block(x)
            return F.linear(self.ln(x), self.wte.weight)

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            cout = 4 * width
            self.body = nn.Sequential(
                nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(True),
                nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width),
                nn.ReLU(True), nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
            self.skip = (nn.Sequential() if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))

        def forward(self, x: Any) -> Any:
            return torch.relu(self.body(x) + self.skip(x))

    def resnet50() -> Any:
        layers: list[Any] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                             nn.ReLU(True), nn.MaxPool2d(3, 2, 1)]
        cin = 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for index in range(blocks):
                layers.append(Bottleneck(cin, width, stride if index == 0 else 1))
                cin = 4 * width
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
        return nn.Sequential(*layers)

    return argparse.Namespace(Llama=Llama, Gpt2=Gpt2, resnet50=resnet50)


def _workload(torch: Any, workload: str, scale: Scale, device: str) -> tuple[
        Callable[[dict[str, int]], tuple[float, str | None]], str]:
    """The workload's model, built on ``device`` from a fixed seed, and a function that runs
    one scheduled step (serving: one request) and returns its loss (serving: the sum of the
    chosen tokens' logits) and, for serving, a digest of the tokens generated. Also names
    where the model came from."""
    models, F = _models(torch), torch.nn.functional
    torch.manual_seed(0)

    def generator(seed: int) -> Any:
        return torch.Generator(device=device).manual_seed(seed)

    if workload == SERVING:
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)  # weights made in bf16, as a bf16 checkpoint loads
        with torch.device(device):
            llama = models.Llama(scale.llama).eval()
        torch.set_default_dtype(previous)

        @torch.inference_mode()
        def serve(step: dict[str, int]) -> tuple[float, str | None]:
            prompt = torch.randint(0, scale.llama.vocab, (step["batch"], step["prompt"]),
                                   generator=generator(step["seed"]), device=device)
            cache: list = [None] * scale.llama.layers
            logits = llama(prompt, cache, 0, last_only=True)[:, -1]
            chosen, tokens = logits.float().max(-1), []
            score = chosen.values.sum()
            for offset in range(step["new"] - 1):
                tokens.append(chosen.indices)
                logits = llama(chosen.indices[:, None], cache, step["prompt"] + offset)[:, -1]
                chosen = logits.float().max(-1)
                score = score + chosen.values.sum()
            tokens.append(chosen.indices)
            digest = hashlib.sha256(str(torch.stack(tokens, 1).tolist()).encode()).hexdigest()
            return score.item(), digest[:16]

        return serve, "own"

    autocast = torch.autocast(device_type=device, dtype=torch.bfloat16)
    source = "own"
    with torch.device(device):
        if workload == "llama-train":
            model: Any = models.Llama(scale.llama)
        elif workload == VARLEN:
            model = models.Gpt2(scale.gpt2)
        else:
            try:
                from torchvision.models import resnet50

                model, source = resnet50(), "torchvision"
            except ImportError:
                model = models.resnet50()
    model.train()
    if workload == "resnet50-train":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4,
                                      fused=device == "cuda" and workload == "llama-train")
    vocab = scale.llama.vocab if workload == "llama-train" else scale.gpt2.vocab

    def train(step: dict[str, int]) -> tuple[float, str | None]:
        g = generator(step["seed"])
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            if workload == "resnet50-train":
                images = torch.randn(step["batch"], 3, step["image"], step["image"], generator=g,
                                     device=device)
                labels = torch.randint(0, 1000, (step["batch"],), generator=g, device=device)
                loss = F.cross_entropy(model(images), labels)
            else:
                ids = torch.randint(0, vocab, (step["batch"], step["seq"] + 1), generator=g,
                                    device=device)
                logits = model(ids[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        return loss.item(), None

    return train, source


def run_workload(workload: str, allocator: str, scale_name: str, snapshot: str | None,
                 deterministic: bool) -> dict[str, Any]:
    """One run in this process: the allocator was chosen by the environment; gpumem's pool is
    installed here before CUDA starts (not in the dry run, which runs on the CPU)."""
    scale = SCALES[scale_name]
    device = "cpu" if scale_name == "dry" else "cuda"
    on_gpumem = allocator.startswith("gpumem-") and device == "cuda"
    if on_gpumem:
        import gpumem.torch as gt

        gt.use(history=HISTORY_EVENTS if snapshot else 0)
    import torch

    torch.backends.cudnn.benchmark = False  # a pluggable allocator has no cacheInfo for it
    if deterministic:
        torch.backends.cudnn.deterministic = True
        torch.use_deterministic_algorithms(True, warn_only=True)

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    step, source = _workload(torch, workload, scale, device)
    warmup = warmup_of(workload, scale)
    losses, outputs, step_ms = [], [], []
    for index, inputs in enumerate(schedule(workload, scale)):
        sync()
        start = time.perf_counter()
        loss, output = step(inputs)
        sync()
        if index >= warmup:
            step_ms.append(1000 * (time.perf_counter() - start))
        losses.append(loss)
        if output is not None:
            outputs.append(output)
    result: dict[str, Any] = {"losses": losses, "outputs": outputs, "step_ms": step_ms,
                              "model_source": source, "torch": torch.__version__,
                              "peak_reserved": None, "peak_allocated": None}
    if on_gpumem:
        import gpumem.torch as gt

        stats = gt.memory_stats()
        result.update(peak_reserved=stats["reserved_bytes.all.peak"],
                      peak_allocated=stats["allocated_bytes.all.peak"], policy=gt.policy(),
                      reserved_source="gpumem.torch.memory_stats() reserved_bytes.all.peak")
        if snapshot:
            gt.snapshot(snapshot)
            result["snapshot"] = snapshot
    elif device == "cuda":
        # Under cudaMallocAsync PyTorch reports the CUDA pool's ReservedMemHigh (memory the
        # driver's pool held at its peak) and, as allocated, its UsedMemHigh.
        reserved_source = ("the CUDA pool's ReservedMemHigh" if allocator == "pytorch-async"
                           else "torch.cuda.max_memory_reserved()")
        result.update(peak_reserved=torch.cuda.max_memory_reserved(),
                      peak_allocated=torch.cuda.max_memory_allocated(),
                      reserved_source=reserved_source)
    else:
        result["reserved_source"] = "not measured (dry run on the CPU)"
    if device == "cuda":
        result.update(device=torch.cuda.get_device_name(), cuda=torch.version.cuda)
    else:
        result["device"] = "cpu"
    return result


def child_main(args: argparse.Namespace) -> int:
    """Runs one workload and writes its result (or its error) as JSON to ``args.result``."""
    try:
        result = run_workload(args.workload, args.allocator, args.scale, args.snapshot,
                              args.deterministic)
        status = 0
    except BaseException as error:  # noqa: BLE001 - every failure is the run's result
        result = {"error": f"{type(error).__name__}: {error}"[:4000],
                  "traceback": traceback.format_exc()[-6000:]}
        status = 1
    with open(args.result, "w") as f:
        json.dump(result, f)
    return status


# ---------------------------------------------------------------------------------------------
# Running the children (parent process).


def child_env(allocator: str, deterministic: bool) -> dict[str, str]:
    """This environment without any allocator setting, plus the allocator's own."""
    env = {k: v for k, v in os.environ.items() if k not in ALLOCATOR_VARIABLES}
    env.update(ALLOCATORS[allocator])
    if deterministic:
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    return env


def run_process(argv: list[str], env: dict[str, str], timeout: float,
                log: str) -> tuple[int | None, float]:
    """Runs argv with its output in ``log``; its exit status (None: killed at ``timeout``,
    with its process group) and wall seconds."""
    start = time.monotonic()
    with open(log, "w") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
        try:
            status: int | None = process.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            status = None
    return status, time.monotonic() - start


def tail(path: str, lines: int = 30) -> str:
    """The last lines of a log."""
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def child_argv(workload: str, allocator: str, scale: str, result: str, snapshot: str | None,
               deterministic: bool) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--child", "--workload", workload,
            "--allocator", allocator, "--scale", scale, "--result", result,
            "--deterministic" if deterministic else "--no-deterministic",
            *(["--snapshot", snapshot] if snapshot else [])]


def one_run(rep: int, workload: str, allocator: str, scale: str, folder: str,
            deterministic: bool, timeout: float) -> dict[str, Any]:
    """One (workload, allocator) run in a fresh process: its record."""
    name = f"{workload}-{allocator}-rep{rep}"
    result_path, log = os.path.join(folder, f"{name}.json"), os.path.join(folder, f"{name}.log")
    snapshot = (os.path.join(folder, f"{name}.pickle")
                if allocator.startswith("gpumem-") and scale != "dry" else None)
    for stale in (result_path, snapshot):
        if stale and os.path.exists(stale):
            os.remove(stale)
    argv = child_argv(workload, allocator, scale, result_path, snapshot, deterministic)
    status, wall = run_process(argv, child_env(allocator, deterministic), timeout, log)
    record: dict[str, Any] = {"workload": workload, "allocator": allocator, "rep": rep,
                              "exit_status": status, "wall_s": round(wall, 2), "log": log}
    if os.path.exists(result_path):
        with open(result_path) as f:
            record.update(json.load(f))
    if status is None:
        record.update(status="killed", error=f"killed after {wall:.0f} s (the budget's end)")
    elif status == 0 and "error" not in record:
        record["status"] = "ok"
    else:
        record["status"] = "failed"
        record.setdefault("error", f"exit status {status} without a result:\n{tail(log)}")
    return record


def gpumem_command() -> list[str]:
    """The gpumem CLI: $GPUMEM_BIN, else this Python's gpumem package."""
    binary = os.environ.get("GPUMEM_BIN")
    return [binary] if binary else [sys.executable, "-m", "gpumem"]


def replay(snapshot: str, policy: str) -> dict[str, Any]:
    """``gpumem replay SNAPSHOT --policy POLICY --json``: its peak reserved and allocated."""
    done = subprocess.run([*gpumem_command(), "replay", snapshot, "--policy", policy, "--json"],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"error": f"gpumem replay exited {done.returncode}: {done.stderr[-2000:]}"}
    report = json.loads(done.stdout)
    policy_report = report["policies"][0]
    return {"peak_reserved": policy_report["peak_reserved_bytes"],
            "peak_allocated": policy_report["peak_allocated_bytes"],
            "events": report["trace"]["events"]}


def find_sanitizer() -> str | None:
    """compute-sanitizer: $COMPUTE_SANITIZER, PATH, the CUDA toolkit, or a pip install of
    nvidia-cuda-sanitizer-api beside this Python's packages."""
    candidates = [os.environ.get("COMPUTE_SANITIZER", ""), shutil.which("compute-sanitizer") or "",
                  "/usr/local/cuda/bin/compute-sanitizer"]
    for entry in sys.path:
        # The wheel's layout: nvidia/cu13/bin/ (CUDA 13); nvidia/cuda_sanitizer_api/compute-sanitizer/
        # in the CUDA 12 wheels.
        for layout in (("bin",), ("compute-sanitizer",)):
            candidates += sorted(glob.glob(os.path.join(
                entry or ".", "nvidia", "*", *layout, "compute-sanitizer")))
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def sanitizer_verdict(status: int | None, output: str,
                      child: dict[str, Any] | None) -> tuple[str, str]:
    """(clean | errors | failed | refused | unfinished, detail) from a memcheck run's exit
    status (None: killed), its output and the workload's own result (None: none written)."""
    lines = output.splitlines()
    summary = re.search(r"ERROR SUMMARY: (\d+) error", output)
    if status is None:
        return "unfinished", "did not finish within its time: " + " | ".join(lines[-3:])
    if status == 99 or (summary and int(summary.group(1)) > 0):
        found = [line for line in lines if line.startswith("=========")][:12]
        return "errors", "\n".join(found) or output[-2000:]
    if child is not None and "error" in child:
        return "failed", f"the workload failed under memcheck: {child['error'][:500]}"
    if summary and status == 0 and child is not None:
        return "clean", summary.group(0)
    return "refused", ("compute-sanitizer refused to run here (exit status "
                       f"{status}): " + " | ".join(lines[:8]))


def sanitize(workload: str, sanitizer: str, folder: str, deterministic: bool,
             timeout: float) -> dict[str, Any]:
    """A short run of the workload on the gpumem policy under ``compute-sanitizer --tool
    memcheck``."""
    name = f"{workload}-memcheck"
    result_path, log = os.path.join(folder, f"{name}.json"), os.path.join(folder, f"{name}.log")
    argv = [sanitizer, "--tool", "memcheck", "--error-exitcode", "99",
            *child_argv(workload, GPUMEM, "sanitizer", result_path, None, deterministic)]
    if os.path.exists(result_path):
        os.remove(result_path)
    status, wall = run_process(argv, child_env(GPUMEM, deterministic), timeout, log)
    child = None
    if os.path.exists(result_path):
        with open(result_path) as f:
            child = json.load(f)
    with open(log, errors="replace") as f:
        output = f.read()
    verdict, detail = sanitizer_verdict(status, output, child)
    return {"verdict": verdict, "detail": detail, "exit_status": status,
            "wall_s": round(wall, 2), "log": log}


# ---------------------------------------------------------------------------------------------
# Figures, verdicts and the table: plain functions over the results dict.


def runs_of(results: dict[str, Any], workload: str, allocator: str,
            ok_only: bool = True) -> list[dict[str, Any]]:
    """The runs of (workload, allocator), by repetition; only those that completed unless
    ``ok_only`` is False."""
    return sorted((r for r in results["runs"] if r["workload"] == workload
                   and r["allocator"] == allocator and (r["status"] == "ok" or not ok_only)),
                  key=lambda r: r["rep"])


def peak_reserved(results: dict[str, Any], workload: str, allocator: str) -> int | None:
    """The largest peak reserved over the completed runs that measured it."""
    values = [r["peak_reserved"] for r in runs_of(results, workload, allocator)
              if r.get("peak_reserved") is not None]
    return max(values) if values else None


def step_time(results: dict[str, Any], workload: str, allocator: str) -> float | None:
    """Milliseconds: the median of every timed step over the completed runs; for serving, the
    mean over runs of the time to serve every timed request."""
    runs = [r for r in runs_of(results, workload, allocator) if r.get("step_ms")]
    if not runs:
        return None
    if workload == SERVING:
        return statistics.mean(sum(r["step_ms"]) for r in runs)
    return statistics.median(ms for r in runs for ms in r["step_ms"])


def compare_losses(a: list[float], b: list[float]) -> dict[str, Any]:
    """Exact equality step by step (two NaNs count as equal): whether identical, the first
    step that differs and the largest absolute difference."""
    def same(x: float, y: float) -> bool:
        return x == y or (math.isnan(x) and math.isnan(y))

    differing = [i for i, (x, y) in enumerate(zip(a, b)) if not same(x, y)]
    if len(a) != len(b):
        differing.append(min(len(a), len(b)))
    diffs = [abs(x - y) if not (math.isnan(x) or math.isnan(y)) else math.inf
             for x, y in zip(a, b) if not same(x, y)]
    if len(a) != len(b):
        diffs.append(math.inf)
    return {"identical": not differing, "first_step": differing[0] if differing else None,
            "max_abs_diff": max(diffs, default=0.0)}


def gib(value: int | None) -> str:
    return "n/m" if value is None else f"{value / GIB:.2f}"


def percent(value: float, reference: float) -> str:
    return f"{100 * (value / reference - 1):+.1f} %"


def check_runs(results: dict[str, Any]) -> list[Verdict]:
    """Every (workload, allocator) ran without an error (a CUDA error included) in every
    repetition that ran; ignored when every repetition was skipped."""
    verdicts = []
    for w in results["config"]["workloads"]:
        for a in results["config"]["allocators"]:
            runs = [r for r in runs_of(results, w, a, ok_only=False) if r["status"] != "skipped"]
            bad = [r for r in runs if r["status"] != "ok"]
            if not runs:
                verdicts.append(Verdict(f"{w}_{a}_no_cuda_error", None, "skipped: no time left"))
            elif bad:
                verdicts.append(Verdict(f"{w}_{a}_no_cuda_error", False, "; ".join(
                    f"rep {r['rep']} {r['status']} (exit status {r.get('exit_status')}): "
                    f"{r.get('error', '')[:1500]}" for r in bad)))
            else:
                verdicts.append(Verdict(f"{w}_{a}_no_cuda_error", True,
                                        f"{len(runs)} runs, exit status 0"))
    return verdicts


#: How far an allocator's losses may stray from PyTorch's default, as a multiple of how far
#: PyTorch's own two runs strayed from each other, where its kernels are not deterministic.
#: Memory handed back too early shows as garbage or NaN, orders of magnitude beyond.
NOISE_MULTIPLE = 4.0


def check_losses(results: dict[str, Any]) -> list[Verdict]:
    """Each allocator's per-step losses equal PyTorch's default, repetition by repetition.
    Where PyTorch's own two runs agree (deterministic kernels) any difference fails; where
    they differ, a difference within NOISE_MULTIPLE times theirs passes; with one repetition
    of PyTorch, a difference is ignored (its kernels' determinism is unknown)."""
    verdicts = []
    deterministic = results["config"]["deterministic"]
    for w in results["config"]["workloads"]:
        reference = {r["rep"]: r["losses"] for r in runs_of(results, w, REFERENCE)}
        own = (compare_losses(reference[1], reference[2])
               if {1, 2} <= reference.keys() else None)
        for a in results["config"]["allocators"]:
            if a == REFERENCE:
                continue
            name = f"{w}_{a}_losses_identical"
            pairs = [(r["rep"], compare_losses(reference[r["rep"]], r["losses"]))
                     for r in runs_of(results, w, a) if r["rep"] in reference]
            if not deterministic:
                verdicts.append(Verdict(name, None, "not compared: run without --deterministic"))
                continue
            if not pairs:
                verdicts.append(Verdict(name, None, "not compared: no pair of completed runs"))
                continue
            if all(c["identical"] for _, c in pairs):
                verdicts.append(Verdict(name, True, f"identical in {len(pairs)} repetitions"))
                continue
            detail = "; ".join(
                f"rep {rep}: " + ("identical" if c["identical"] else
                                  f"differ from step {c['first_step']}, "
                                  f"max |difference| {c['max_abs_diff']:.3g}")
                for rep, c in pairs)
            if own is None:
                verdicts.append(Verdict(name, None, detail + " (one run of PyTorch: whether its "
                                        "kernels are deterministic here is unknown)"))
            elif own["identical"]:
                verdicts.append(Verdict(name, False, detail + " (PyTorch's own two runs agree)"))
            else:
                bound = NOISE_MULTIPLE * own["max_abs_diff"]
                worst = max(c["max_abs_diff"] for _, c in pairs)
                verdicts.append(Verdict(
                    name, worst <= bound,
                    detail + f" (PyTorch's own two runs differ by up to {own['max_abs_diff']:.3g}:"
                    f" the kernels are not deterministic; allowed {bound:.3g})"))
    return verdicts


def check_replays(results: dict[str, Any]) -> list[Verdict]:
    """For each gpumem run: its snapshot replayed through the same policy gives its peak
    reserved to the byte."""
    verdicts = []
    for r in results["runs"]:
        if not r["allocator"].startswith("gpumem-"):
            continue
        name = f"{r['workload']}_{r['allocator']}_rep{r['rep']}_replay_equals_reserved"
        got = r.get("replay")
        if r["status"] != "ok" or r.get("peak_reserved") is None or got is None:
            verdicts.append(Verdict(name, None, "no snapshot of a completed run on the GPU"))
        elif "error" in got:
            verdicts.append(Verdict(name, False, got["error"]))
        else:
            verdicts.append(Verdict(
                name, got["peak_reserved"] == r["peak_reserved"],
                f"run {r['peak_reserved']} B, replay {got['peak_reserved']} B "
                f"({got['peak_reserved'] - r['peak_reserved']:+d} B); allocated "
                f"{r['peak_allocated']} B vs {got['peak_allocated']} B; {got['events']} events"))
    return verdicts


def check_memcheck(results: dict[str, Any]) -> list[Verdict]:
    """compute-sanitizer memcheck found nothing on each workload's short gpumem run."""
    verdicts = []
    for w in results["config"]["workloads"]:
        run = results["sanitizer"].get(w, {"verdict": "skipped", "detail": "not run"})
        ok = {"clean": True, "errors": False, "failed": False}.get(run["verdict"])
        verdicts.append(Verdict(f"{w}_memcheck_clean", ok, f"{run['verdict']}: {run['detail']}"))
    return verdicts


def goal_reserved_vs_expandable(results: dict[str, Any]) -> list[Verdict]:
    """Goal: on every workload gpumem's policy reserves no more than PyTorch with
    expandable segments."""
    verdicts = []
    for w in results["config"]["workloads"]:
        name = f"{w}_gpumem_reserved_at_most_expandable"
        ours, theirs = peak_reserved(results, w, GPUMEM), peak_reserved(results, w,
                                                                        "pytorch-expandable")
        if ours is None or theirs is None:
            verdicts.append(Verdict(name, None, "not measured"))
        else:
            verdicts.append(Verdict(name, ours <= theirs, f"gpumem {gib(ours)} GiB vs "
                                    f"expandable_segments {gib(theirs)} GiB "
                                    f"({percent(ours, theirs)})"))
    return verdicts


def goal_varlen_saving(results: dict[str, Any]) -> list[Verdict]:
    """Goal: on the variable-length GPT-2 run gpumem's policy reserves at least 5 % less than
    PyTorch's default."""
    if VARLEN not in results["config"]["workloads"]:
        return []
    name = f"{VARLEN}_gpumem_reserved_5pct_below_pytorch"
    ours, theirs = peak_reserved(results, VARLEN, GPUMEM), peak_reserved(results, VARLEN,
                                                                         REFERENCE)
    if ours is None or theirs is None:
        return [Verdict(name, None, "not measured")]
    return [Verdict(name, ours <= 0.95 * theirs,
                    f"gpumem {gib(ours)} GiB vs PyTorch {gib(theirs)} GiB "
                    f"({percent(ours, theirs)})")]


def goal_step_time(results: dict[str, Any]) -> list[Verdict]:
    """Goal: gpumem's policy is at most 3 % slower than PyTorch's default: the median step of
    every training workload, the time to serve the requests. Ignored where PyTorch's own two
    repetitions differ by more than 3 %: the timing cannot resolve the goal there."""
    verdicts = []
    for w in results["config"]["workloads"]:
        what = "serving_time" if w == SERVING else "step_time"
        name = f"{w}_gpumem_{what}_within_3pct"
        ours, theirs = step_time(results, w, GPUMEM), step_time(results, w, REFERENCE)
        if ours is None or theirs is None:
            verdicts.append(Verdict(name, None, "not measured"))
            continue
        detail = f"{ours:.2f} ms vs {theirs:.2f} ms ({percent(ours, theirs)})"
        measure = sum if w == SERVING else statistics.median
        own = [measure(r["step_ms"]) for r in runs_of(results, w, REFERENCE)
               if r["status"] == "ok" and r["step_ms"]]
        spread = max(own) / min(own) - 1 if len(own) >= 2 else 0.0
        if spread > 0.03:
            verdicts.append(Verdict(name, None, detail + f" (PyTorch's own repetitions differ by "
                                    f"{100 * spread:.1f} %: too noisy to decide 3 %)"))
        else:
            verdicts.append(Verdict(name, ours <= 1.03 * theirs, detail))
    return verdicts


def all_verdicts(results: dict[str, Any]) -> list[Verdict]:
    """Every check and goal, in print order."""
    return [*check_runs(results), *check_losses(results), *check_replays(results),
            *check_memcheck(results), *goal_reserved_vs_expandable(results),
            *goal_varlen_saving(results), *goal_step_time(results)]


def _losses_cell(results: dict[str, Any], workload: str, allocator: str) -> str:
    runs = runs_of(results, workload, allocator)
    if allocator == REFERENCE:
        if len(runs) < 2:
            return "(reference)"
        c = compare_losses(runs[0]["losses"], runs[1]["losses"])
        return ("reference; rep 1 = rep 2" if c["identical"] else
                f"reference; rep 1 != rep 2 (max {c['max_abs_diff']:.2g})")
    reference = {r["rep"]: r["losses"] for r in runs_of(results, workload, REFERENCE)}
    pairs = [(r["rep"], compare_losses(reference[r["rep"]], r["losses"]))
             for r in runs if r["rep"] in reference]
    if not pairs:
        return "-"
    if all(c["identical"] for _, c in pairs):
        return "yes"
    return "no: " + ", ".join(f"rep {rep} from step {c['first_step']}, max "
                              f"{c['max_abs_diff']:.2g}" for rep, c in pairs if not c["identical"])


def _replay_cell(run_list: list[dict[str, Any]]) -> str:
    cells = []
    for r in run_list:
        got = r.get("replay")
        if got is None or r.get("peak_reserved") is None:
            cells.append("n/m")
        elif "error" in got:
            cells.append("error")
        elif got["peak_reserved"] == r["peak_reserved"]:
            cells.append("yes")
        else:
            cells.append(f"no ({got['peak_reserved'] - r['peak_reserved']:+d} B)")
    return " / ".join(cells) if cells else "-"


def render_table(results: dict[str, Any]) -> str:
    """The markdown table: one row per (workload, allocator)."""
    lines = ["| workload | allocator | median ms (rep 1 / rep 2) | peak reserved GiB | "
             "vs PyTorch default | peak allocated GiB | losses identical | "
             "replay = reserved | errors |",
             "|---|---|---:|---:|---:|---:|---|---|---|"]
    for w in results["config"]["workloads"]:
        reference = peak_reserved(results, w, REFERENCE)
        for a in results["config"]["allocators"]:
            every = runs_of(results, w, a, ok_only=False)
            done = [r for r in every if r["status"] == "ok"]
            medians = " / ".join(f"{statistics.median(r['step_ms']):.2f}" for r in done
                                 if r.get("step_ms")) or "-"
            reserved = sorted({r["peak_reserved"] for r in done if r.get("peak_reserved")})
            ours = peak_reserved(results, w, a)
            versus = ("-" if ours is None or reference is None else
                      "(reference)" if a == REFERENCE else percent(ours, reference))
            allocated = max((r["peak_allocated"] for r in done if r.get("peak_allocated")),
                            default=None)
            errors = "; ".join(
                f"rep {r['rep']} {r['status']}" + (
                    f": {r.get('error', '').splitlines()[0][:80]}" if r.get("error") else "")
                for r in every if r["status"] != "ok")
            replay_cell = _replay_cell(done) if a.startswith("gpumem-") else "-"
            lines.append(
                f"| {w} | {a} | {medians} | {' / '.join(gib(v) for v in reserved) or 'n/m'} | "
                f"{versus} | {gib(allocated)} | {_losses_cell(results, w, a)} | "
                f"{replay_cell} | {errors.replace('|', '/')} |")
    lines.append("")
    lines.append("llama-serve's times are per request; pytorch-async's reserved is the CUDA "
                 "pool's ReservedMemHigh and its allocated the pool's UsedMemHigh.")
    if results["sanitizer"]:
        lines += ["", "| workload | memcheck on the gpumem policy |", "|---|---|"]
        for w, run in results["sanitizer"].items():
            lines.append(f"| {w} | {run['verdict']}: "
                         f"{run['detail'].splitlines()[0][:120] if run['detail'] else ''} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The whole check.


def say(message: str) -> None:
    print(f"allocators_gpu: {message}", file=sys.stderr, flush=True)


def orchestrate(args: argparse.Namespace) -> dict[str, Any]:
    """Every run, interleaved by repetition, within the budget; then the replays and the
    sanitizer runs. Returns the results dict."""
    scale = "dry" if args.dry_run else "gpu"
    folder = args.keep or os.path.join(os.path.dirname(os.path.abspath(args.out)),
                                       "allocators-runs")
    os.makedirs(folder, exist_ok=True)
    started = time.monotonic()
    results: dict[str, Any] = {
        "config": {"scale": scale, "dry_run": args.dry_run, "deterministic": args.deterministic,
                   "budget_s": args.budget_s, "reps": args.reps, "workloads": args.workloads,
                   "allocators": args.allocators, "allocator_env": ALLOCATORS,
                   "scale_sizes": dataclasses.asdict(SCALES[scale]), "runs_folder": folder},
        "runs": [], "sanitizer": {}}
    plan = plan_runs(args.workloads, args.allocators, args.reps)
    # Time kept for the sanitizer runs: the timed runs stop where it begins.
    runs_budget = args.budget_s - (args.sanitizer_reserve_s if not args.dry_run else 0)
    longest: dict[str, float] = {}
    for number, (rep, workload, allocator) in enumerate(plan, 1):
        left = runs_budget - (time.monotonic() - started)
        estimate = longest.get(workload, FIRST_RUN_ESTIMATE_S)
        label = f"[{number}/{len(plan)} rep {rep}] {workload} / {allocator}"
        if left < estimate:
            results["runs"].append({"workload": workload, "allocator": allocator, "rep": rep,
                                    "status": "skipped", "error": f"{left:.0f} s left of the "
                                    f"budget, about {estimate:.0f} s needed"})
            say(f"{label}: skipped ({left:.0f} s left)")
            continue
        run = one_run(rep, workload, allocator, scale, folder, args.deterministic, left)
        longest[workload] = max(longest.get(workload, 0.0), run["wall_s"])
        results["runs"].append(run)
        figures = (f"median {statistics.median(run['step_ms']):.2f} ms, reserved "
                   f"{gib(run.get('peak_reserved'))} GiB" if run["status"] == "ok"
                   else (run.get("error") or "no error text").splitlines()[0][:200])
        say(f"{label}: {run['status']}, {figures} ({run['wall_s']:.1f} s)")
    snapshots = [r for r in results["runs"] if r.get("snapshot") and r["status"] == "ok"]
    if snapshots:
        say(f"replaying {len(snapshots)} gpumem snapshots through their own policies")
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            replays = pool.map(lambda r: replay(r["snapshot"],
                                                ALLOCATORS[r["allocator"]]["GPUMEM_POOL"]),
                               snapshots)
            for run, got in zip(snapshots, replays):
                run["replay"] = got
    sanitizer = None if args.dry_run else find_sanitizer()
    for index, workload in enumerate(args.workloads):
        if sanitizer is None:
            what = "dry run: no GPU" if args.dry_run else "not installed"
            results["sanitizer"][workload] = {"verdict": "not installed" if not args.dry_run
                                              else "skipped", "detail": what}
            continue
        left = args.budget_s - (time.monotonic() - started)
        share = left / (len(args.workloads) - index)
        if share < 20:
            results["sanitizer"][workload] = {"verdict": "skipped",
                                              "detail": f"{left:.0f} s left of the budget"}
            continue
        say(f"memcheck: {workload} on {GPUMEM} ({share:.0f} s at most)")
        results["sanitizer"][workload] = sanitize(workload, sanitizer, folder,
                                                  args.deterministic, share)
        say(f"memcheck: {workload}: {results['sanitizer'][workload]['verdict']}")
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", default="target/gpu-check/allocators.json",
                        help="the JSON results file")
    parser.add_argument("--keep", help="the folder for each run's log, result and snapshot "
                        "(default: allocators-runs beside --out)")
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny models on the CPU: checks the orchestration, not the figures")
    parser.add_argument("--budget-s", type=float, default=480.0,
                        help="seconds for everything; runs that would not fit are skipped")
    parser.add_argument("--sanitizer-reserve-s", type=float, default=100.0,
                        help="seconds of the budget kept for the memcheck runs")
    parser.add_argument("--reps", type=int, default=2, help="interleaved repetitions")
    parser.add_argument("--workloads", type=lambda s: s.split(","), default=list(WORKLOADS),
                        help=f"comma-separated, of {','.join(WORKLOADS)}")
    parser.add_argument("--allocators", type=lambda s: s.split(","), default=list(ALLOCATORS),
                        help=f"comma-separated, of {','.join(ALLOCATORS)}")
    parser.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=True,
                        help="deterministic algorithms and cuBLAS workspaces, so that losses "
                        "can be compared exactly (default on)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workload", choices=WORKLOADS, help=argparse.SUPPRESS)
    parser.add_argument("--allocator", choices=list(ALLOCATORS), help=argparse.SUPPRESS)
    parser.add_argument("--scale", choices=list(SCALES), default="gpu", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--snapshot", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name, known in (("workloads", WORKLOADS), ("allocators", ALLOCATORS)):
        unknown = set(getattr(args, name)) - set(known)
        if unknown:
            parser.error(f"unknown {name}: {', '.join(sorted(unknown))}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    results = orchestrate(args)
    verdicts = all_verdicts(results)
    results["verdicts"] = [v._asdict() for v in verdicts]
    for v in verdicts:
        print(f"test {v.name} ... {'ignored' if v.ok is None else 'ok' if v.ok else 'FAILED'}")
        print("    " + v.detail.replace("\n", "\n    "))
    print()
    print(render_table(results))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nresults: {args.out} ({results['elapsed_s']} s)")
    if args.dry_run:
        # The figures of tiny models on a CPU mean nothing: only the runs themselves count.
        failed = [v.name for v in check_runs(results) if v.ok is False]
        print("dry run: only whether every run completed sets the exit status")
    else:
        failed = [v.name for v in verdicts if v.ok is False]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
