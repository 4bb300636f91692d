"""The part of :func:`gpumem.torch.trace` that needs no PyTorch: the record of a training
step's allocations (every storage created and freed, with its bytes, step, phase, module and
kind), CUDA's rounding, the gpumem trace (the native "gpumem-trace v1" JSON lines that
``gpumem replay`` reads) built in memory and replayed in-process, the GPU's facts as the
planner knows them, and the :class:`~gpumem.results.StepTrace` result.

:mod:`gpumem._torch_trace` drives a :class:`Recorder` from PyTorch's dispatcher; the tests drive
it by hand (``python/tests/test_torch_trace.py``).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Iterable, Iterator

#: The CUDA caching allocator's smallest block: every request is rounded up to a multiple of it
#: (``kMinBlockSize`` in c10/cuda/CUDACachingAllocator.cpp), and that is what
#: ``torch.cuda.max_memory_allocated`` counts.
CUDA_MIN_BLOCK = 512

#: The phases of a step, in order.
PHASES = ("inputs", "forward", "loss", "backward", "optimizer", "zero_grad")

#: What an allocation holds.
KINDS = ("parameter", "buffer", "input", "activation", "output", "temporary", "gradient",
         "optimizer_state", "blas_workspace")

#: The policies the trace is replayed through (``torch`` is PyTorch's default allocator and
#: gives the reserved memory, as for ``gpumem plan``).
POLICIES = ("torch", "expandable", "gpumem")

#: The model the GPU's facts are read from (a plan of it costs about a millisecond).
_PROBE = {"model": "gpt2", "mode": "infer", "batch": 1, "seq": 8, "reserved": "estimate"}


def cuda_rounded(nbytes: int) -> int:
    """The bytes CUDA's caching allocator hands out for a request of ``nbytes``: a multiple of
    512, at least 512; nothing for zero bytes (PyTorch allocates no block for an empty
    storage)."""
    if nbytes <= 0:
        return 0
    return -(-nbytes // CUDA_MIN_BLOCK) * CUDA_MIN_BLOCK


@dataclasses.dataclass(eq=False)
class Allocation:
    """One storage: its requested bytes and where it was made. ``kind`` and ``name`` may be
    corrected after the fact (a gradient is known as one only once it is a parameter's
    ``.grad``); ``host`` marks a tensor that a CUDA run keeps in host memory (an optimizer's
    step counter), left out of the trace."""

    index: int
    nbytes: int
    step: int | None
    phase: str
    module: str
    op: str
    kind: str
    name: str = ""
    host: bool = False

    @property
    def rounded(self) -> int:
        """The bytes CUDA's allocator holds for it (0 for host memory)."""
        return 0 if self.host else cuda_rounded(self.nbytes)


class Recorder:
    """The allocation sequence of a run: allocations and frees in order, labelled with the
    step, phase and module current when they were made."""

    def __init__(self) -> None:
        #: (True for an allocation, False for a free, the allocation), in order.
        self.events: list[tuple[bool, Allocation]] = []
        #: The event index at which each step starts.
        self.step_starts: list[int] = []
        self.step: int | None = None
        self.phase = "setup"
        self._modules: list[str] = []
        self._backward_module = ""
        self._live: dict[int, Allocation] = {}
        self._count = 0
        #: Whether events are taken (frees that come after the run are not).
        self.recording = True

    # --- where the run is ---------------------------------------------------------------

    def start_step(self) -> None:
        """Begins the next step (phase ``inputs``)."""
        self.step = 0 if self.step is None else self.step + 1
        self.step_starts.append(len(self.events))
        self.set_phase("inputs")

    def set_phase(self, phase: str) -> None:
        if phase not in PHASES and phase != "setup":
            raise ValueError(f"unknown phase {phase!r}; phases are {', '.join(PHASES)}")
        self.phase = phase
        self._backward_module = ""

    def enter_module(self, name: str) -> None:
        """A module's forward begins (nested modules push their full names)."""
        self._modules.append(name)

    def exit_module(self) -> None:
        if self._modules:
            self._modules.pop()

    def backward_module(self, name: str) -> None:
        """The autograd engine reached the backward of module ``name``."""
        self._backward_module = name

    @property
    def module(self) -> str:
        """The module allocations are attributed to now ("" outside every module)."""
        if self.phase == "backward":
            return self._backward_module
        return self._modules[-1] if self._modules else ""

    def _default_kind(self) -> str:
        return {"setup": "parameter", "inputs": "input", "forward": "activation",
                "loss": "activation"}.get(self.phase, "temporary")

    # --- allocations --------------------------------------------------------------------

    def alloc(self, nbytes: int, *, op: str = "", kind: str | None = None, name: str = "",
              module: str | None = None) -> Allocation | None:
        """Records a storage of ``nbytes`` made now (in ``module``, by default the current
        one); None (nothing recorded) for zero bytes, which CUDA's allocator does not
        allocate, or when recording has stopped."""
        if nbytes <= 0 or not self.recording:
            return None
        if kind is not None and kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}; kinds are {', '.join(KINDS)}")
        made = Allocation(self._count, int(nbytes), self.step, self.phase,
                          self.module if module is None else module, op,
                          kind or self._default_kind(), name)
        self._count += 1
        self._live[made.index] = made
        self.events.append((True, made))
        return made

    def free(self, allocation: Allocation | None) -> None:
        """Records that ``allocation``'s storage was freed (again, or None: nothing)."""
        if allocation is None or not self.recording:
            return
        if self._live.pop(allocation.index, None) is not None:
            self.events.append((False, allocation))

    def live(self) -> list[Allocation]:
        """The allocations live now, oldest first."""
        return list(self._live.values())


# --- what the record says ---------------------------------------------------------------

@dataclasses.dataclass
class StepPeak:
    """The peak of one step in CUDA-rounded bytes: its value, the event that reached it and
    the phase of that event, the requested bytes then and the allocations live then."""

    step: int
    allocated: int
    requested: int
    event: int
    phase: str
    live: list[Allocation]
    phases: dict[str, int]


def _walk(recorder: Recorder) -> Iterator[tuple[int, bool, Allocation, int, int]]:
    """(event index, is alloc, allocation, rounded bytes live after it, requested bytes live
    after it) for every event, host allocations skipped."""
    rounded = requested = 0
    for i, (is_alloc, made) in enumerate(recorder.events):
        if made.host:
            continue
        sign = 1 if is_alloc else -1
        rounded += sign * made.rounded
        requested += sign * made.nbytes
        yield i, is_alloc, made, rounded, requested


def step_peaks(recorder: Recorder) -> list[StepPeak]:
    """Each step's peak (over its events, from its start to the next step's), in CUDA-rounded
    bytes as ``max_memory_allocated`` after ``reset_peak_memory_stats()`` at the step's start:
    the first event of a step may leave less than the step began with, so the peak starts at
    what was live then."""
    starts = recorder.step_starts
    if not starts:
        return []
    step_of = {}
    for s, start in enumerate(starts):
        end = starts[s + 1] if s + 1 < len(starts) else len(recorder.events)
        for i in range(start, end):
            step_of[i] = s
    best: dict[int, tuple[int, int, int]] = {}
    phases: dict[int, dict[str, int]] = {s: {} for s in range(len(starts))}
    before = (0, 0)
    for i, is_alloc, made, rounded, requested in _walk(recorder):
        s = step_of.get(i)
        if s is None:
            before = (rounded, requested)
            continue
        if s not in best:
            # What was live when the step began.
            best[s] = (before[0], before[1], starts[s] - 1)
        if rounded > best[s][0]:
            best[s] = (rounded, requested, i)
        if is_alloc:
            phase_peaks = phases[s]
            phase_peaks[made.phase] = max(phase_peaks.get(made.phase, 0), rounded)
        before = (rounded, requested)
    peaks = []
    for s in range(len(starts)):
        allocated, requested, event = best.get(s, (before[0], before[1], starts[s] - 1))
        live: dict[int, Allocation] = {}
        for i, (is_alloc, made) in enumerate(recorder.events[:event + 1]):
            if made.host:
                continue
            if is_alloc:
                live[made.index] = made
            else:
                live.pop(made.index, None)
        phase = recorder.events[event][1].phase if event >= starts[s] else "inputs"
        peaks.append(StepPeak(s, allocated, requested, event, phase, list(live.values()),
                              phases[s]))
    return peaks


def native_trace(recorder: Recorder, *, name: str, meta: dict[str, str] | None = None,
                 device_total: int | None = None) -> bytes:
    """The record as a gpumem trace (JSON lines, gpumem-trace v1): each allocation at its own
    address (bump-allocated, never reused), its requested bytes as the size (the replay rounds
    as each policy does), a ``step`` event where each step starts."""
    lines = [json.dumps({"gpumem_trace": 1, "name": name, "source": "gpumem.torch.trace",
                         "device_total": device_total, "meta": dict(meta or {})})]
    address: dict[int, int] = {}
    next_address = 0
    starts = {start: s for s, start in enumerate(recorder.step_starts)}
    for i, (is_alloc, made) in enumerate(recorder.events):
        if i in starts:
            lines.append(f'{{"op":"step","index":{starts[i]}}}')
        if made.host:
            continue
        if is_alloc:
            address[made.index] = next_address
            next_address += max(made.rounded, CUDA_MIN_BLOCK)
            op = "alloc"
        else:
            op = "free"
        lines.append(f'{{"op":"{op}","addr":{address[made.index]},"size":{made.nbytes},'
                     f'"stream":0}}')
    for s, start in enumerate(recorder.step_starts):
        if start >= len(recorder.events):
            lines.append(f'{{"op":"step","index":{s}}}')
    return ("\n".join(lines) + "\n").encode()


@dataclasses.dataclass(frozen=True)
class GpuFacts:
    """What the planner knows of a GPU: its name and memory (None: no GPU asked about), the
    CUDA context and framework bytes outside the allocator, cuBLAS's workspace, and its
    multiprocessors as the planner's reduction and cuDNN rules read them (``gpu::Cores``:
    ``multiprocessors``, ``threads_per_multiprocessor``, ``amd``, ``tf32``)."""

    name: str | None
    memory_bytes: int | None
    context_bytes: int
    blas_workspace_bytes: int
    multiprocessors: int = 132
    threads_per_multiprocessor: int = 2048
    amd: bool = False
    tf32: bool = True

    @property
    def generation(self) -> str:
        """The GPU's generation as the planner's facts tell it: ``"amd"``; ``"pre-ampere"``
        (NVIDIA without TF32: Volta, Turing); ``"hopper"`` (Ampere or later with Hopper's
        32 MiB cuBLAS workspace: Hopper and Blackwell, sm90/sm100); ``"ampere"`` (Ampere,
        Ada)."""
        if self.amd:
            return "amd"
        if not self.tf32:
            return "pre-ampere"
        return "hopper" if self.blas_workspace_bytes >= 32 << 20 else "ampere"


def gpu_facts(gpu: str | int | None) -> GpuFacts:
    """The planner's facts of ``gpu`` (a catalogue name such as ``"h100"`` or a size such as
    ``"24GiB"``, as for ``gpumem plan --gpu``, or a size in bytes as an int; None: the
    planner's default GPU, Hopper's workspace): read from a plan of a tiny model on it, so the
    names, sizes and errors are the planner's own."""
    import gpumem

    settings: dict[str, Any] = dict(_PROBE)
    if gpu is not None:
        settings["gpu"] = planner_gpu(gpu)
    plan = gpumem.plan(**settings)
    cores = (plan.to_dict().get("workload") or {}).get("cores") or {}
    return GpuFacts(
        name=plan.gpu.name if plan.gpu is not None else None,
        memory_bytes=plan.gpu.memory_bytes if plan.gpu is not None else None,
        context_bytes=plan.breakdown.framework,
        blas_workspace_bytes=plan.breakdown.blas_workspace,
        multiprocessors=int(cores.get("multiprocessors", 132)),
        threads_per_multiprocessor=int(cores.get("threads_per_multiprocessor", 2048)),
        amd=bool(cores.get("amd", False)),
        tf32=bool(cores.get("tf32", True)),
    )


def planner_gpu(gpu: str | int) -> str:
    """``gpu`` as ``gpumem plan --gpu`` reads it: a name or size as given; a size in bytes (an
    int) in MiB, a decimal that is exact (a byte is 2**-20 MiB), as the planner takes no
    bytes unit."""
    if isinstance(gpu, bool) or not isinstance(gpu, (str, int)):
        raise TypeError(f"gpu must be a GPU name or size as a str (\"h100\", \"24GiB\") or a "
                        f"size in bytes as an int, not {type(gpu).__name__}")
    if isinstance(gpu, str):
        return gpu
    if gpu <= 0:
        raise ValueError(f"gpu as an int is a size in bytes and must be positive, not {gpu}")
    return f"{gpu / (1 << 20):.20f}".rstrip("0").rstrip(".") + "MiB"


def column_sum_staging_bytes(rows: int, cols: int, facts: GpuFacts) -> list[int]:
    """The buffers CUDA's column sum of a contiguous ``rows × cols`` tensor into ``cols``
    outputs (``grad.sum(0)``: a linear's bias gradient) allocates through the caching
    allocator inside the kernel: the blocks' fp32 partial sums and their semaphores, when
    ``setReduceConfig`` (aten/src/ATen/native/cuda/Reduce.cuh) splits the rows across blocks;
    none when one block sums them. The planner's own rule (``gpu::column_sum_staging``,
    crates/gpumem-plan/src/gpu.rs), called through the extension."""
    from gpumem import _gpumem

    if rows <= 0 or cols <= 0:
        return []
    return _gpumem.column_sum_staging(rows, cols, facts.multiprocessors,
                                      facts.threads_per_multiprocessor, facts.amd)


def replay_trace(trace: bytes, facts: GpuFacts) -> Any:
    """The trace replayed through :data:`POLICIES` (in-process, as :func:`gpumem.replay`), on
    the memory the allocator can use on the GPU (its memory less the CUDA context) when one
    is given."""
    import gpumem

    capacity = None
    if facts.memory_bytes is not None:
        capacity = max(facts.memory_bytes - facts.context_bytes, 0)
    return gpumem.replay(trace, format="native", policies=list(POLICIES), capacity=capacity)


def _tensor(made: Allocation) -> dict[str, Any]:
    return {"bytes": made.rounded, "requested_bytes": made.nbytes, "kind": made.kind,
            "name": made.name, "module": made.module, "phase": made.phase, "step": made.step,
            "op": made.op}


def _modules(live: Iterable[Allocation], top: int) -> list[dict[str, Any]]:
    """The modules holding the most bytes at the peak (by the module each allocation was made
    in; parameters, buffers and their gradients and states by the module that owns them)."""
    held: dict[str, list[int]] = {}
    for made in live:
        module = made.module
        if made.kind in ("parameter", "buffer", "gradient", "optimizer_state") and made.name:
            module = made.name.rpartition(".")[0] if "." in made.name else ""
            if made.kind == "optimizer_state":
                # "layer.weight.exp_avg": the parameter's owner.
                module = module.rpartition(".")[0] if "." in module else ""
        if made.kind == "blas_workspace":
            module = "(cuBLAS workspaces)"
        entry = held.setdefault(module, [0, 0])
        entry[0] += made.rounded
        entry[1] += 1
    ranked = sorted(held.items(), key=lambda item: (-item[1][0], item[0]))
    return [{"module": module or "(model)", "bytes": b, "tensors": n}
            for module, (b, n) in ranked[:top]]


def result(recorder: Recorder, *, facts: GpuFacts, replay: Any, steps: int, amp: str | None,
           mapped: list[str], seconds: float, top: int = 10) -> Any:
    """The :class:`~gpumem.results.StepTrace` of a recorded run and its replay: the last step's
    peak, reserved per policy, the fit, and what is live at the peak."""
    from gpumem.results import StepTrace

    peaks = step_peaks(recorder)
    if not peaks:
        raise ValueError("the record holds no step")
    last = peaks[-1]
    by_policy = {p.policy: p for p in replay.policies}
    torch_policy = by_policy["torch"]
    reserved = torch_policy.peak_reserved_bytes
    total = reserved + facts.context_bytes
    breakdown = {kind: 0 for kind in KINDS}
    for made in last.live:
        breakdown[made.kind] += made.rounded
    largest = sorted(last.live, key=lambda made: (-made.nbytes, made.index))[:top]
    peak_event = recorder.events[last.event][1] if last.event >= 0 else None
    data: dict[str, Any] = {
        "steps": steps,
        "amp": amp,
        "events": len(recorder.events),
        "peak_allocated_bytes": last.allocated,
        "peak_requested_bytes": last.requested,
        "peak_reserved_bytes": reserved,
        "peak_total_bytes": total,
        "peak_step": last.step,
        "peak_phase": last.phase,
        "peak_module": peak_event.module if peak_event is not None else "",
        "breakdown": breakdown,
        "phases": [{"phase": phase, "allocated_bytes": last.phases[phase]}
                   for phase in PHASES if phase in last.phases],
        "step_peaks": [peak.allocated for peak in peaks],
        "policies": [{"policy": p.policy, "peak_allocated_bytes": p.peak_allocated_bytes,
                      "peak_reserved_bytes": p.peak_reserved_bytes}
                     for p in replay.policies],
        "largest_tensors": [_tensor(made) for made in largest],
        "largest_modules": _modules(last.live, top),
        "context_bytes": facts.context_bytes,
        "blas_workspace_bytes": facts.blas_workspace_bytes,
        "mapped": list(mapped),
        "seconds": seconds,
        "replay": replay.to_dict(),
        "gpu": None if facts.memory_bytes is None else {
            "name": facts.name,
            "memory_bytes": facts.memory_bytes,
            "fits": total <= facts.memory_bytes and torch_policy.oom is None,
        },
    }
    return StepTrace.from_dict(data)
