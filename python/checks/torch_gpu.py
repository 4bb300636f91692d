"""PyTorch and CuPy on gpumem, on an NVIDIA GPU (run by scripts/gpu-python.sh from
scripts/gpu-check.sh; results of its run on an H200 are in docs/gpu.md).

For a small GPT-2-style transformer and a small ResNet, a few training steps run twice, each in
its own process (an allocator is chosen before CUDA starts): with PyTorch's own caching
allocator and with ``gpumem.torch.use()``. Checked:

- the losses are identical (deterministic algorithms, same seed);
- gpumem's peak reserved memory against PyTorch's ``max_memory_reserved`` (goal: >= 5 % less);
- the median step time (goal: within 3 %);
- ``gpumem.torch.snapshot`` writes a pickle that PyTorch's own memory_viz code renders;
- a forced OOM (a hard limit just above what is reserved) raises ``torch.OutOfMemoryError``
  carrying gpumem's explanation;
- CuPy (when installed): an array workload with ``gpumem.cupy.use()`` gives numpy's result and
  leaves no allocation behind;
- a third run with PyTorch's allocator records its history from the start: the snapshot that
  PyTorch itself writes, replayed through gpumem's ``torch`` policy (``gpumem replay``), must
  give PyTorch's own ``max_memory_reserved`` to the byte, and the ``gpumem`` policy's replay
  of the same snapshot is reported beside it (``--keep DIR`` keeps these snapshots).

Each check prints ``test NAME ... ok|FAILED|ignored`` (the lines scripts/gpu-check.sh tables),
then the figures; all results go to the JSON file given by ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

MIB = 1 << 20
# Enough steps that the GPU's clocks have settled before the timed ones: with 8 steps of
# 10-15 ms after 2 warm-ups, two runs on an H200 disagreed by 20 % (docs/gpu.md).
STEPS = 40
WARMUP = 10


def gpt2_model(torch: Any) -> tuple[Any, Any]:
    """A 4-layer GPT-2-shaped decoder (d=512, 8 heads, vocab 8192, context 256) and a batch."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, d: int, heads: int) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x: Any, mask: Any) -> Any:
            h = self.ln1(x)
            x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    class Gpt(nn.Module):
        def __init__(self, vocab: int = 8192, d: int = 512, layers: int = 4, ctx: int = 256):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
            self.blocks = nn.ModuleList(Block(d, 8) for _ in range(layers))
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

        def forward(self, ids: Any) -> Any:
            t = ids.shape[1]
            mask = torch.triu(torch.ones(t, t, device=ids.device, dtype=torch.bool), 1)
            x = self.tok(ids) + self.pos(torch.arange(t, device=ids.device))
            for block in self.blocks:
                x = block(x, mask)
            return self.head(self.ln(x))

    model = Gpt().cuda()
    ids = torch.randint(0, 8192, (8, 256), device="cuda")

    def loss() -> Any:
        logits = model(ids[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                           ids[:, 1:].reshape(-1))

    return model, loss


def resnet_model(torch: Any) -> tuple[Any, Any]:
    """A ResNet-18-shaped network on 16 images of 128x128 with 100 classes, and its loss."""
    nn = torch.nn

    class Basic(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.skip = (nn.Sequential() if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))

        def forward(self, x: Any) -> Any:
            y = torch.relu(self.b1(self.c1(x)))
            return torch.relu(self.b2(self.c2(y)) + self.skip(x))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
              nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
        layers += [Basic(cin, cout, stride), Basic(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 100)]
    model = nn.Sequential(*layers).cuda()
    images = torch.randn(16, 3, 128, 128, device="cuda")
    labels = torch.randint(0, 100, (16,), device="cuda")
    return model, lambda: nn.functional.cross_entropy(model(images), labels)


MODELS = {"gpt2": gpt2_model, "resnet": resnet_model}


def train(model_name: str, allocator: str, snapshot_path: str | None) -> dict[str, Any]:
    """One configuration, in this process: returns losses, step times and peak reserved."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if allocator == "gpumem":
        import gpumem.torch as gt

        gt.use(policy="gpumem", history=200_000 if snapshot_path else 0)
    import torch

    if allocator == "torch" and snapshot_path:
        torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False  # cacheInfo is not available to a pluggable allocator
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    model, loss_of = MODELS[model_name](torch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses, times = [], []
    for _ in range(STEPS):
        torch.cuda.synchronize()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of()
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    result: dict[str, Any] = {"losses": losses, "step_seconds": statistics.median(times[WARMUP:])}
    if allocator == "gpumem":
        import gpumem.torch as gt

        result["peak_reserved"] = gt.memory_stats()["reserved_bytes.all.peak"]
        result["summary"] = gt.memory_summary()
        if snapshot_path:
            gt.snapshot(snapshot_path)
        result["oom"] = forced_oom(torch, gt)
    else:
        result["peak_reserved"] = torch.cuda.max_memory_reserved()
        result["peak_allocated"] = torch.cuda.max_memory_allocated()
        if snapshot_path:
            with open(snapshot_path, "wb") as f:
                pickle.dump(torch.cuda.memory._snapshot(), f)
    return result


def replayed(snapshot: str) -> dict[str, Any]:
    """`gpumem replay SNAPSHOT --json` (this Python's gpumem package): peak reserved and
    allocated per policy."""
    done = subprocess.run([sys.executable, "-m", "gpumem", "replay", snapshot, "--json"],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"gpumem replay {snapshot} failed:\n{done.stderr}")
    return {p["policy"]: {"peak_reserved": p["peak_reserved_bytes"],
                          "peak_allocated": p["peak_allocated_bytes"]}
            for p in json.loads(done.stdout)["policies"]}


def forced_oom(torch: Any, gt: Any) -> dict[str, Any]:
    """A hard limit 64 MiB above what is reserved, then a 1 GiB tensor: the error PyTorch
    raises, and whether it carries gpumem's explanation."""
    reserved = gt.memory_stats()["reserved_bytes.all.current"]
    gt.set_limits(hard_limit=reserved + 64 * MIB)
    try:
        torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        return {"raised": None}
    except Exception as error:  # noqa: BLE001 - the type is what is checked
        return {"raised": f"{type(error).__module__}.{type(error).__name__}",
                "is_torch_oom": isinstance(error, torch.OutOfMemoryError),
                "explained": "What to try" in str(error) and "out of memory" in str(error),
                "message": str(error)[:2000]}
    finally:
        gt.set_limits(hard_limit="none")


def cupy_workload() -> dict[str, Any]:
    """A matrix product with gpumem.cupy.use(), compared with numpy; live allocations after."""
    import cupy
    import numpy

    import gpumem.cupy
    import gpumem.torch as gt

    gpumem.cupy.use()
    rng = numpy.random.default_rng(0)
    a = rng.standard_normal((2048, 2048), dtype=numpy.float32)
    with_gpumem = (cupy.asarray(a) @ cupy.asarray(a)).get()
    peak = gt.memory_stats()["allocated_bytes.all.peak"]
    cupy.get_default_memory_pool().free_all_blocks()
    import gc

    gc.collect()
    return {"max_abs_diff": float(numpy.abs(with_gpumem - a @ a).max()),
            "peak_allocated": peak,
            "live_after": gt.memory_stats()["allocation.all.current"]}


def child(args: argparse.Namespace) -> int:
    """Runs one configuration and writes its result as JSON to args.out."""
    result = cupy_workload() if args.model == "cupy" else train(args.model, args.allocator,
                                                                args.snapshot)
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


def run_child(model: str, allocator: str, scratch: str, snapshot: str | None = None) -> dict:
    out = os.path.join(scratch, f"{model}-{allocator}.json")
    argv = [sys.executable, __file__, "--child", "--model", model, "--allocator", allocator,
            "--out", out] + (["--snapshot", snapshot] if snapshot else [])
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{model}/{allocator} failed:\n{done.stdout}\n{done.stderr}")
    with open(out) as f:
        return json.load(f)


def report(name: str, ok: bool | None, detail: str) -> bool:
    verdict = "ignored" if ok is None else "ok" if ok else "FAILED"
    print(f"test {name} ... {verdict}")
    print(f"    {detail}")
    return ok is not False


def memory_viz_renders(path: str) -> tuple[bool, str]:
    """Whether PyTorch's own memory_viz code reads the snapshot (the HTML it would show)."""
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    from torch.cuda import _memory_viz

    html = _memory_viz.trace_plot(snapshot)
    segments = _memory_viz.segment_plot(snapshot)
    ok = len(html) > 1000 and len(segments) > 1000 and len(snapshot["device_traces"][0]) > 0
    return ok, (f"{len(snapshot['segments'])} segments, {len(snapshot['device_traces'][0])} "
                f"events; trace_plot {len(html)} bytes of HTML")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=[*MODELS, "cupy"])
    parser.add_argument("--allocator", choices=["torch", "gpumem"], default="torch")
    parser.add_argument("--snapshot")
    parser.add_argument("--out", default="target/gpu-check/python-results.json")
    parser.add_argument("--keep", help="a folder to keep the recorded PyTorch snapshots in")
    args = parser.parse_args()
    if args.child:
        return child(args)
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    results: dict[str, Any] = {}
    all_ok = True
    with tempfile.TemporaryDirectory(prefix="gpumem-gpu-") as scratch:
        for model in MODELS:
            snapshot = os.path.join(scratch, f"{model}.pickle")
            try:
                torch_run = run_child(model, "torch", scratch)
                gpumem_run = run_child(model, "gpumem", scratch, snapshot)
            except RuntimeError as error:
                all_ok &= report(f"{model}_runs", False, str(error)[-3000:])
                continue
            results[model] = {"torch": torch_run, "gpumem": gpumem_run}
            same = torch_run["losses"] == gpumem_run["losses"]
            diff = max(abs(a - b) for a, b in zip(torch_run["losses"], gpumem_run["losses"]))
            all_ok &= report(f"{model}_identical_losses", same,
                             f"losses {gpumem_run['losses'][:3]}...; max difference {diff:g}")
            saving = 1 - gpumem_run["peak_reserved"] / torch_run["peak_reserved"]
            all_ok &= report(
                f"{model}_peak_reserved_5pct_below_pytorch", saving >= 0.05,
                f"gpumem {gpumem_run['peak_reserved'] / MIB:.1f} MiB vs PyTorch "
                f"max_memory_reserved {torch_run['peak_reserved'] / MIB:.1f} MiB "
                f"({100 * saving:+.1f} % less)")
            slower = gpumem_run["step_seconds"] / torch_run["step_seconds"] - 1
            all_ok &= report(
                f"{model}_step_time_within_3pct", slower <= 0.03,
                f"median step {1000 * gpumem_run['step_seconds']:.2f} ms vs "
                f"{1000 * torch_run['step_seconds']:.2f} ms ({100 * slower:+.1f} %)")
            ok, detail = memory_viz_renders(snapshot)
            all_ok &= report(f"{model}_snapshot_opens_in_memory_viz", ok, detail)
            recorded_snapshot = os.path.join(args.keep or scratch, f"{model}-torch.pickle")
            try:
                recorded = run_child(model, "torch", scratch, recorded_snapshot)
                replay = replayed(recorded_snapshot)
            except RuntimeError as error:
                all_ok &= report(f"{model}_replay_gives_pytorch_reserved", False,
                                 str(error)[-3000:])
                continue
            results[model]["torch_recorded"] = recorded
            results[model]["replay"] = replay
            real = recorded["peak_reserved"]
            all_ok &= report(
                f"{model}_replay_gives_pytorch_reserved", replay["torch"]["peak_reserved"] == real,
                f"PyTorch max_memory_reserved {real} B, its snapshot replayed: torch policy "
                f"{replay['torch']['peak_reserved']} B, allocated {recorded['peak_allocated']} "
                f"B vs {replay['torch']['peak_allocated']} B; gpumem policy "
                f"{replay['gpumem']['peak_reserved'] / MIB:.1f} MiB, expandable "
                f"{replay['expandable']['peak_reserved'] / MIB:.1f} MiB")
            oom = gpumem_run["oom"]
            all_ok &= report(f"{model}_forced_oom_is_torch_oom_with_explanation",
                             bool(oom.get("is_torch_oom") and oom.get("explained")),
                             f"raised {oom.get('raised')}: {oom.get('message', '')[:300]!r}")
        try:
            import cupy  # noqa: F401

            have_cupy = True
        except ImportError:
            have_cupy = False
        if have_cupy:
            cupy_run = run_child("cupy", "gpumem", scratch)
            results["cupy"] = cupy_run
            all_ok &= report("cupy_matmul_on_gpumem",
                             cupy_run["max_abs_diff"] < 1e-2 and cupy_run["live_after"] == 0,
                             f"max |cupy - numpy| {cupy_run['max_abs_diff']:g}, peak allocated "
                             f"{cupy_run['peak_allocated'] / MIB:.1f} MiB, "
                             f"live after {cupy_run['live_after']}")
        else:
            report("cupy_matmul_on_gpumem", None, "CuPy is not installed")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"results: {args.out}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
