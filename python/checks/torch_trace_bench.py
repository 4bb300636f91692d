"""gpumem.torch.trace beside PyTorch's MemTracker (``torch.distributed._tools.mem_tracker``) on
the same models and the same training step (opt-in: scripts/bench-torch-trace.sh; needs
PyTorch, transformers and the repository's tools package; no GPU).

Models: a catalogue model (GPT-2, 2 layers, ``testdata/plan/configs/gpt2-2l.json``, through
transformers), and three outside the catalogue from ``torch_trace_cpu.py`` (a hand-written
decoder, a UNet, a speech-like conv + transformer encoder). The step is the trace's: inputs
cloned, forward, loss, backward, AdamW (foreach) step, ``zero_grad(set_to_none=True)``; two
steps, the peak of the second.

Reference: the real step on CPU tensors recorded by the CPU allocator (the tools package's
``CpuRecorder``, the method of ``testdata/plan/measured*.jsonl``: every requested byte,
oneDNN's scratch included), the model built inside the recording.

Columns, each a peak of the second step in requested bytes against the reference, and the wall
time of one plan (build of the copy, two steps, and for gpumem the replay):

* ``trace cpu``: ``gpumem._torch_trace.record(..., cuda_rules=False)`` (the CPU's own
  kernels: what is compared with the reference);
* ``MemTracker real``: MemTracker around the real CPU step (``reset_mod_stats()`` before the
  second step, which it needs, and its peak reset through its private ``_peak_mem``: it has
  no public reset);
* ``MemTracker fake``: MemTracker with the model, optimizer and inputs made under
  ``FakeTensorMode`` on the CPU device;
* ``MemTracker fake cuda``: the same on the ``cuda`` device, as one would plan for a GPU (fails
  on a machine without one: the error is printed);
* ``trace h100``: ``gpumem.torch.trace(..., gpu="h100")`` (CUDA's rules, replayed through the
  allocator policies; no reference on this machine: its time and answers).
"""

from __future__ import annotations

import copy
import pathlib
import statistics
import sys
import time
from typing import Any, Callable

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("torch_trace_bench.py: skipped: PyTorch is not installed in this Python")
    raise SystemExit(0)

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import torch_trace_cpu as models  # noqa: E402

import gpumem.torch as gt  # noqa: E402
from gpumem import _steptrace, _torch_trace  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
MIB = 2**20
REPEAT = 2


def gpt2() -> tuple[torch.nn.Module, dict[str, torch.Tensor], Callable[[Any], Any] | None]:
    from gpumem_devtools.models import build

    wl = build(REPO / "testdata/plan/configs/gpt2-2l.json", "fp32", "sdpa")
    ids = torch.randint(0, wl.vocab_size, (2, 256))
    return wl.model, {"input_ids": ids, "labels": ids.clone()}, None


def tiny_lm() -> tuple[torch.nn.Module, dict[str, torch.Tensor], None]:
    ids = torch.randint(0, 1000, (8, 64))
    return models.TinyLM(), {"input_ids": ids, "labels": ids.clone()}, None


def unet() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], None]:
    return models.UNet(), (torch.randn(4, 3, 64, 64), torch.randn(4, 3, 64, 64)), None


def speech() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], None]:
    return models.Speech(), (torch.randn(4, 80, 400), torch.randint(1, 32, (4, 100))), None


MODELS = {
    "GPT-2 2l b2 s256 (catalogue)": gpt2,
    "custom decoder b8 s64": tiny_lm,
    "UNet b4 64x64": unet,
    "speech conv+encoder b4": speech,
}


def loss_of(output: Any, loss_fn: Callable[[Any], Any] | None) -> torch.Tensor:
    if loss_fn is not None:
        return loss_fn(output)
    return output if isinstance(output, torch.Tensor) else output.loss


def step(model: torch.nn.Module, inputs: Any, optimizer: Any,
         loss_fn: Callable[[Any], Any] | None) -> None:
    batch = (tuple(t.clone() for t in inputs) if isinstance(inputs, tuple)
             else {k: v.clone() for k, v in inputs.items()})
    output = model(*batch) if isinstance(batch, tuple) else model(**batch)
    loss = loss_of(output, loss_fn)
    loss.backward()
    del loss, output
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    del batch


def reference(make: Callable[[], Any]) -> int:
    """The real step's peak (second step) from the CPU allocator's trace."""
    from gpumem_devtools.recorder import CpuRecorder

    rec = CpuRecorder()
    with rec:
        torch.manual_seed(0)
        model, inputs, loss_fn = make()
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
        for _ in range(2):
            rec.boundary("step")
            step(model, inputs, optimizer, loss_fn)
        rec.boundary("end")
    tl = rec.timeline()
    peak, _ = tl.peak_between(tl.boundary_times("step")[-1], tl.boundary_times("end")[-1])
    return peak


def trace_cpu(make: Callable[[], Any]) -> int:
    torch.manual_seed(0)
    model, inputs, loss_fn = make()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    recorder = _torch_trace.record(model, inputs, optimizer=optimizer, loss_fn=loss_fn,
                                   steps=2, cuda_rules=False)
    return _steptrace.step_peaks(recorder)[-1].requested


def trace_h100(make: Callable[[], Any]) -> Any:
    torch.manual_seed(0)
    model, inputs, loss_fn = make()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    return gt.trace(model, inputs, optimizer=optimizer, loss_fn=loss_fn, steps=2, gpu="h100")


def memtracker(make: Callable[[], Any], fake: str | None) -> int:
    """MemTracker's peak of the second step: real CPU tensors (``fake`` None) or the model,
    optimizer and inputs made under FakeTensorMode on ``fake`` ("cpu" or "cuda")."""
    torch.manual_seed(0)
    mode = FakeTensorMode() if fake else None
    if mode is not None:
        with mode:
            model, inputs, loss_fn = make()
            if fake == "cuda":
                model = model.to("cuda")
                inputs = (tuple(t.to("cuda") for t in inputs) if isinstance(inputs, tuple)
                          else {k: v.to("cuda") for k, v in inputs.items()})
    else:
        model, inputs, loss_fn = make()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with (mode if mode is not None else _null()):
        with tracker:
            step(model, inputs, optimizer, loss_fn)
            tracker.reset_mod_stats()  # it refuses a module's second forward otherwise
            tracker._peak_mem.clear()  # no public reset of the peak
            tracker._peak_mem_snap.clear()
            step(model, inputs, optimizer, loss_fn)
    peak = tracker.get_tracker_snapshot("peak")
    return max(snap["Total"] for snap in peak.values())


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def timed(function: Callable[[], Any]) -> tuple[Any, float]:
    """The result and the median wall time of REPEAT calls (s)."""
    times, result = [], None
    for _ in range(REPEAT):
        started = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - started)
    return result, statistics.median(times)


def main() -> int:
    torch.set_num_threads(2)
    print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}, "
          f"{torch.get_num_threads()} threads; median of {REPEAT} runs")
    rows = []
    for name, make in MODELS.items():
        truth, t_real = timed(lambda: reference(make))
        traced, t_trace = timed(lambda: trace_cpu(make))
        mt_real, t_mt_real = timed(lambda: memtracker(make, None))
        try:
            mt_fake, t_mt_fake = timed(lambda: memtracker(make, "cpu"))
        except Exception as error:  # noqa: BLE001
            mt_fake, t_mt_fake = f"{type(error).__name__}: {str(error)[:80]}", float("nan")
        try:
            mt_cuda, t_mt_cuda = memtracker(make, "cuda"), float("nan")
        except Exception as error:  # noqa: BLE001
            mt_cuda, t_mt_cuda = f"{type(error).__name__}: {str(error)[:90]}", float("nan")
        result, t_h100 = timed(lambda: trace_h100(make))
        rows.append((name, truth, t_real, traced, t_trace, mt_real, t_mt_real, mt_fake,
                     t_mt_fake, mt_cuda, result, t_h100))

    def cell(value: Any, truth: int) -> str:
        if isinstance(value, str):
            return "fails"
        return f"{value / MIB:.1f} ({value / truth - 1:+.2%})"

    print()
    print("| model | real CPU step (reference) | trace cpu | MemTracker real | MemTracker fake "
          "(CPU) | MemTracker fake cuda | trace h100: allocated / reserved |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for (name, truth, t_real, traced, t_trace, mt_real, t_mt_real, mt_fake, t_mt_fake,
         mt_cuda, result, t_h100) in rows:
        print(f"| {name} | {truth / MIB:.1f} MiB | {cell(traced, truth)} | "
              f"{cell(mt_real, truth)} | {cell(mt_fake, truth)} | "
              f"{'fails' if isinstance(mt_cuda, str) else cell(mt_cuda, truth)} | "
              f"{result.peak_allocated_bytes / MIB:.1f} / {result.peak_reserved_bytes / MIB:.1f}"
              f" MiB |")
    print()
    print("| model (wall time of one plan) | real CPU step | trace cpu | MemTracker real | "
          "MemTracker fake (CPU) | trace h100 (+ replay) | trace h100 / MemTracker fake |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for (name, truth, t_real, traced, t_trace, mt_real, t_mt_real, mt_fake, t_mt_fake,
         mt_cuda, result, t_h100) in rows:
        print(f"| {name} | {t_real:.2f} s | {t_trace:.2f} s | {t_mt_real:.2f} s | "
              f"{t_mt_fake:.2f} s | {t_h100:.2f} s | {t_h100 / t_mt_fake:.2f} |")
    print()
    for row in rows:
        for what, value in (("fake (CPU)", row[7]), ("fake cuda", row[9])):
            if isinstance(value, str):
                print(f"MemTracker {what}, {row[0]}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
