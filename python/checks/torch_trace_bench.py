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
* ``MemTracker fake``: MemTracker with the model, inputs and optimizer made under
  ``FakeTensorMode`` on the CPU device: ``with FakeTensorMode(): with torch.device(dev):
  model = ...`` (MemTracker's tests build on a device with ``torch.device(dev)``, the docs of
  PyTorch's runtime and SAC estimators inside ``FakeTensorMode()``), and model, optimizer and
  inputs passed to ``track_external`` as MemTracker's docstring does. Where that fails, the
  same run on a copy of the real CPU model made with ``FakeCopyMode`` (``deepcopy``, as the
  trace copies a model) is reported beside the failure;
* ``MemTracker fake cuda``: the same built on the ``cuda`` device, as one would plan for a GPU
  (on a machine without one the error and the phase it failed in are printed);
* ``trace h100``: ``gpumem.torch.trace(..., gpu="h100")`` (CUDA's rules, replayed through the
  allocator policies; no reference on this machine: its time and answers).
"""

from __future__ import annotations

import copy
import os
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

from torch._subclasses.fake_tensor import FakeCopyMode, FakeTensorMode  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import torch_trace_cpu as models  # noqa: E402

import gpumem.torch as gt  # noqa: E402
from gpumem import _steptrace, _torch_trace  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
MIB = 2**20
REPEAT = int(os.environ.get("BENCH_REPEAT", "3"))


def gpt2() -> tuple[torch.nn.Module, dict[str, torch.Tensor], Callable[[Any], Any] | None]:
    """The tools package's ``build`` of the config without its final ``.to(device)``: under
    ``FakeTensorMode`` that swaps the parameters (``torch.utils.swap_tensors``), which fails
    on the embedding (``Cannot swap t1 because it has weakref associated with it``). The
    device comes from the caller's ``torch.device`` context instead."""
    import transformers
    from gpumem_devtools.models import kwargs_for, load_config

    cfg = load_config(REPO / "testdata/plan/configs/gpt2-2l.json")
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**cfg), **kwargs_for(torch.float32, "sdpa"))
    ids = torch.randint(0, cfg["vocab_size"], (2, 256))
    return model, {"input_ids": ids, "labels": ids.clone()}, None


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
         loss_fn: Callable[[Any], Any] | None, phase: list[str] | None = None) -> None:
    def at(name: str) -> None:
        if phase is not None:
            phase[0] = name

    at("forward")
    batch = (tuple(t.clone() for t in inputs) if isinstance(inputs, tuple)
             else {k: v.clone() for k, v in inputs.items()})
    output = model(*batch) if isinstance(batch, tuple) else model(**batch)
    loss = loss_of(output, loss_fn)
    at("backward")
    loss.backward()
    del loss, output
    at("optimizer step")
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


class Failed(Exception):
    """A MemTracker run that raised: where (build, forward, backward, optimizer step) and the
    error."""

    def __init__(self, phase: str, error: BaseException) -> None:
        super().__init__(f"in {phase}: {type(error).__name__}: {error}")


def memtracker(make: Callable[[], Any], fake: str | None, copied: bool = False) -> int:
    """MemTracker's peak of the second step: real CPU tensors (``fake`` None), or the model,
    inputs and optimizer made under FakeTensorMode on the device ``fake`` ("cpu" or "cuda")
    inside ``torch.device(fake)``, as MemTracker's tests build models; ``copied``: the model
    built real on the CPU and copied to fake tensors with ``FakeCopyMode`` instead."""
    torch.manual_seed(0)
    phase = ["build"]
    try:
        if fake is None:
            model, inputs, loss_fn = make()
            mode: Any = _null()
        elif copied:
            mode = FakeTensorMode()
            real, real_inputs, loss_fn = make()
            with FakeCopyMode(mode):
                model = copy.deepcopy(real)
            del real
            inputs = (tuple(mode.from_tensor(t) for t in real_inputs)
                      if isinstance(real_inputs, tuple)
                      else {k: mode.from_tensor(v) for k, v in real_inputs.items()})
        else:
            mode = FakeTensorMode()
            with mode, torch.device(fake):
                model, inputs, loss_fn = make()
        with mode:
            model.train()
            optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
            tracker = MemTracker()
            tracker.track_external(model, optimizer, inputs)
            with tracker:
                step(model, inputs, optimizer, loss_fn, phase)
                tracker.reset_mod_stats()  # it refuses a module's second forward otherwise
                tracker._peak_mem.clear()  # no public reset of the peak
                tracker._peak_mem_snap.clear()
                step(model, inputs, optimizer, loss_fn, phase)
    except Exception as error:  # noqa: BLE001
        raise Failed(phase[0], error) from error
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
    rows, failures = [], []
    for name, make in MODELS.items():
        truth, t_real = timed(lambda: reference(make))
        traced, t_trace = timed(lambda: trace_cpu(make))
        mt_real, t_mt_real = timed(lambda: memtracker(make, None))
        copied = False
        try:
            mt_fake, t_mt_fake = timed(lambda: memtracker(make, "cpu"))
        except Failed as error:
            failures.append(f"MemTracker fake (CPU), {name}: {error}")
            copied = True
            try:
                mt_fake, t_mt_fake = timed(lambda: memtracker(make, "cpu", copied=True))
            except Failed as again:
                failures.append(f"MemTracker fake (CPU, FakeCopyMode copy), {name}: {again}")
                mt_fake, t_mt_fake = None, float("nan")
        try:
            mt_cuda, t_mt_cuda = timed(lambda: memtracker(make, "cuda"))
        except Failed as error:
            failures.append(f"MemTracker fake cuda, {name}: {error}")
            mt_cuda, t_mt_cuda = None, float("nan")
        result, t_h100 = timed(lambda: trace_h100(make))
        rows.append((name, truth, t_real, traced, t_trace, mt_real, t_mt_real, mt_fake,
                     t_mt_fake, copied, mt_cuda, t_mt_cuda, result, t_h100))

    def cell(value: int | None, truth: int, mark: str = "") -> str:
        if value is None:
            return "fails"
        return f"{value / MIB:.1f} ({value / truth - 1:+.2%}){mark}"

    print()
    print("| model | real CPU step (reference) | trace cpu | MemTracker real | MemTracker fake "
          "(CPU) | MemTracker fake cuda | trace h100: allocated / reserved |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for (name, truth, t_real, traced, t_trace, mt_real, t_mt_real, mt_fake, t_mt_fake, copied,
         mt_cuda, t_mt_cuda, result, t_h100) in rows:
        fake_cell = (f"fails; copied: {cell(mt_fake, truth)}" if copied
                     else cell(mt_fake, truth))
        print(f"| {name} | {truth / MIB:.1f} MiB | {cell(traced, truth)} | "
              f"{cell(mt_real, truth)} | {fake_cell} | {cell(mt_cuda, truth)} | "
              f"{result.peak_allocated_bytes / MIB:.1f} / {result.peak_reserved_bytes / MIB:.1f}"
              f" MiB |")
    print()
    print("| model (wall time of one plan) | real CPU step | trace cpu | MemTracker real | "
          "MemTracker fake (CPU) | MemTracker fake cuda | trace h100 (+ replay) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for (name, truth, t_real, traced, t_trace, mt_real, t_mt_real, mt_fake, t_mt_fake, copied,
         mt_cuda, t_mt_cuda, result, t_h100) in rows:
        print(f"| {name} | {t_real:.2f} s | {t_trace:.2f} s | {t_mt_real:.2f} s | "
              f"{t_mt_fake:.2f} s{' (copied)' if copied else ''} | {t_mt_cuda:.2f} s | "
              f"{t_h100:.2f} s |")
    print()
    for failure in failures:
        print(failure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
