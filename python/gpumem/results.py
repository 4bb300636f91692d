"""The typed results of :mod:`gpumem`'s calls: one frozen dataclass per report type of the Rust
libraries, field for field (``python/tests/test_results.py`` checks them against the JSON schema the
Rust tests pin, ``testdata/schema/reports.json``). Each is built from the JSON the extension
returns; :meth:`Report.to_dict` gives that JSON back, exactly as the command's ``--json``
prints it."""

from __future__ import annotations

import copy
import dataclasses
import functools
import types
import typing
from typing import Any, TypeVar, Union

T = TypeVar("T", bound="Report")


@dataclasses.dataclass(frozen=True)
class Report:
    """Base of every result: fields read as attributes; :meth:`to_dict` is the JSON object."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON object this was built from (a copy), as ``gpumem ... --json`` prints it."""
        return copy.deepcopy(self.__dict__["_json"])

    @classmethod
    def from_dict(cls: type[T], data: dict[str, Any]) -> T:
        """Builds the result from its JSON object; absent optional fields are None."""
        return _build(cls, data)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(kind: Any, value: Any) -> Any:
    """``value`` (parsed JSON) as ``kind``: dataclasses, lists and optionals recursively."""
    if isinstance(kind, type) and issubclass(kind, Report):
        hints = _hints(kind)
        made = kind(**{f.name: _build(hints[f.name], value.get(f.name))
                       for f in dataclasses.fields(kind)})
        object.__setattr__(made, "_json", value)
        return made
    origin = typing.get_origin(kind)
    if origin is list:
        (item,) = typing.get_args(kind)
        return [_build(item, v) for v in value]
    if origin in (Union, types.UnionType):
        if value is None:
            return None
        (present,) = [a for a in typing.get_args(kind) if a is not type(None)]
        return _build(present, value)
    return value


# --- gpumem plan ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Breakdown(Report):
    """What the peak consists of, bytes per kind."""

    weights: int
    gradients: int
    optimizer_states: int
    activations: int
    kv_cache: int
    temporaries: int
    blas_workspace: int
    framework: int
    communication: int
    allocator: int


@dataclasses.dataclass(frozen=True)
class PhasePeak(Report):
    """The peak allocated bytes of one phase of the step."""

    phase: str
    allocated_bytes: int


@dataclasses.dataclass(frozen=True)
class PlanWarning(Report):
    """Something the request asks that a run would do, but probably not as meant."""

    kind: str
    message: str


@dataclasses.dataclass(frozen=True)
class PlannedReserved(Report):
    """The planned allocations replayed through one allocator policy (within the GPU named,
    emptying its cache ``alloc_retries`` times where it must)."""

    policy: str
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    alloc_retries: int


@dataclasses.dataclass(frozen=True)
class Suggestion(Report):
    """One change to the plan and its effect; ``saved_bytes`` < 0 when it needs more."""

    change: str
    new_peak_total_bytes: int
    saved_bytes: int
    cost: str
    fits: bool | None


@dataclasses.dataclass(frozen=True)
class GpuVerdict(Report):
    """The GPU asked about and whether the plan fits it."""

    name: str
    memory_bytes: int
    fits: bool


@dataclasses.dataclass(frozen=True)
class FitResult(Report):
    """The largest batch or sequence (``target``) that fits, and what it holds."""

    target: str
    value: int
    margin: float
    usable_bytes: int
    grad_accum: int
    global_batch: int
    reserved_bytes: int
    total_bytes: int


@dataclasses.dataclass(frozen=True)
class MinGpus(Report):
    """The fewest GPUs for the layout (None: not on up to ``searched_up_to``)."""

    gpus: int | None
    searched_up_to: int


@dataclasses.dataclass(frozen=True)
class PlanThatFits(Report):
    """Changes that together make the plan fit the GPU."""

    changes: list[str]
    peak_total_bytes: int


@dataclasses.dataclass(frozen=True)
class ServeSettings(Report):
    """A serving engine's settings as planned (vLLM's flags of the same names)."""

    engine: str
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    gpu_memory_utilization: float
    block_size: int
    non_torch_bytes: int


@dataclasses.dataclass(frozen=True)
class ServingProfile(Report):
    """The engine's start-up profile (weights, activation peak) and the KV cache it leaves."""

    settings: ServeSettings
    weights_bytes: int
    forward_peak_bytes: int
    sampler_peak_bytes: int
    activation_peak_bytes: int
    kv_bytes_per_token: int
    gpu_bytes: int | None
    kv_cache_bytes: int | None
    gpu_blocks: int | None
    kv_tokens: int | None
    max_concurrency: float | None


@dataclasses.dataclass(frozen=True)
class Plan(Report):
    """The answer of :func:`gpumem.plan`: ``gpumem plan --json``."""

    model: str
    workload: dict[str, Any]
    reserved_by: str
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_total_bytes: int
    peak_phase: str
    breakdown: Breakdown
    kv_cache_kind: str | None
    phases: list[PhasePeak]
    total_params: int
    trainable_params: int
    warnings: list[PlanWarning]
    replay: list[PlannedReserved]
    advice: list[Suggestion]
    gpu: GpuVerdict | None = None
    fit: FitResult | None = None
    min_gpus: MinGpus | None = None
    plan_that_fits: PlanThatFits | None = None
    fit_error: str | None = None
    serving: ServingProfile | None = None


# --- gpumem replay / tune -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TraceInfo(Report):
    """The trace a report is about."""

    name: str
    source: str
    events: int
    steps: int
    peak_live_bytes: int
    skipped: list[str]
    """What the reader left out of the trace, a sentence per kind (RMM ``allocate failure``
    rows, snapshot entries of unknown actions); empty when nothing."""


@dataclasses.dataclass(frozen=True)
class OomReport(Report):
    """Where a policy ran out of memory at the capacity checked, and why."""

    capacity_bytes: int
    event_index: int
    step: int | None
    requested_bytes: int
    allocated_bytes: int
    reserved_bytes: int
    message: str


@dataclasses.dataclass(frozen=True)
class InitialState(Report):
    """For a trace recorded mid-process: the segments a policy began from."""

    segments: int
    adopted_segments: int
    adopted_bytes: int
    allocated_blocks: int
    notes: list[str]


@dataclasses.dataclass(frozen=True)
class PolicyReport(Report):
    """One policy's replay of a trace."""

    policy: str
    peak_allocated_bytes: int
    peak_requested_bytes: int
    peak_reserved_bytes: int
    utilization: float
    device_calls: int
    device_alloc_calls: int
    steady_state_alloc_calls_per_step: int | None
    steady_state_device_calls_per_step: int | None
    steady_state_syncs_per_step: int | None
    synchronizations: int
    hazards: int
    steps: int
    num_alloc_retries: int
    oom: OomReport | None
    smallest_capacity_bytes: int | None
    events: int
    events_per_second: float
    initial_state: InitialState | None = None


@dataclasses.dataclass(frozen=True)
class Replay(Report):
    """The answer of :func:`gpumem.replay`: ``gpumem replay --json`` of one trace."""

    trace: TraceInfo
    capacity_bytes: int | None
    policies: list[PolicyReport]


@dataclasses.dataclass(frozen=True)
class Tuned(Report):
    """One allocator setting tried: its PYTORCH_CUDA_ALLOC_CONF and its replay."""

    conf: str
    export: str
    margin_bytes: int | None
    report: PolicyReport


@dataclasses.dataclass(frozen=True)
class SearchSpace(Report):
    """The option values tried on the trace, and what was not searched."""

    max_split_sizes: list[int]
    max_non_split_roundings: list[int]
    large_segment_sizes_torch: list[int]
    large_segment_sizes_expandable: list[int]
    divisions: list[int]
    intervals: list[int]
    notes: list[str]


@dataclasses.dataclass(frozen=True)
class TuneReport(Report):
    """The settings found, best first, and what they are compared with."""

    objective: str
    capacity_bytes: int | None
    ranked: list[Tuned]
    best_without_expandable: Tuned | None
    pytorch_default: Tuned
    gpumem: PolicyReport
    space: SearchSpace
    replays: int
    budget: int
    complete: bool
    seconds: float


@dataclasses.dataclass(frozen=True)
class Tune(Report):
    """The answer of :func:`gpumem.tune`: ``gpumem tune --json``."""

    trace: TraceInfo
    tune: TuneReport


# --- gpumem policies / devices / selftest ---------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Policy(Report):
    """A built-in allocator policy."""

    name: str
    description: str
    default: bool


@dataclasses.dataclass(frozen=True)
class Device(Report):
    """One device of one backend."""

    backend: str
    ordinal: int
    description: str
    total_bytes: int
    free_bytes: int | None
    vmm_granularity: int | None
    software: bool
    memory_source: str


@dataclasses.dataclass(frozen=True)
class Devices(Report):
    """The answer of :func:`gpumem.devices`: every device here, and why a backend has none."""

    devices: list[Device]
    absent: list[str]


@dataclasses.dataclass(frozen=True)
class Check(Report):
    """One check of a self-test."""

    name: str
    passed: bool
    detail: str


@dataclasses.dataclass(frozen=True)
class SelftestReport(Report):
    """One policy's self-test on a device."""

    device: str
    policy: str
    checks: list[Check]
    bytes_verified: int
    device_alloc_calls: int
    device_free_calls: int
    seconds: float


@dataclasses.dataclass(frozen=True)
class SkippedPolicy(Report):
    """A policy the device cannot run."""

    policy: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Selftest(Report):
    """The answer of :func:`gpumem.selftest`: ``gpumem selftest --json``."""

    reports: list[SelftestReport]
    skipped: list[SkippedPolicy]

    @property
    def passed(self) -> bool:
        """Whether every check of every policy passed."""
        return all(c.passed for r in self.reports for c in r.checks)


# --- gpumem.torch.trace ---------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TracedTensor(Report):
    """One storage live at a traced step's peak: its CUDA-rounded and requested bytes, what it
    holds (``kind``: parameter, buffer, input, activation, output, temporary, gradient,
    optimizer_state, blas_workspace), its name (a parameter's, a gradient's or state's
    parameter and key, an input's key), the module, phase and step it was made in and the
    aten operator that made it."""

    bytes: int
    requested_bytes: int
    kind: str
    name: str
    module: str
    phase: str
    step: int | None
    op: str


@dataclasses.dataclass(frozen=True)
class ModuleMemory(Report):
    """The bytes a module holds at a traced step's peak: what was made in its forward or
    backward, and its own parameters, buffers, gradients and optimizer states."""

    module: str
    bytes: int
    tensors: int


@dataclasses.dataclass(frozen=True)
class StepPolicy(Report):
    """A traced step's allocations replayed through one allocator policy."""

    policy: str
    peak_allocated_bytes: int
    peak_reserved_bytes: int


@dataclasses.dataclass(frozen=True)
class StepTrace(Report):
    """The answer of :func:`gpumem.torch.trace`: a model's own training step, run on fake
    tensors and planned for a CUDA GPU.

    ``peak_allocated_bytes`` is the last step's peak in CUDA's 512-byte blocks
    (``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats()`` at its start);
    ``peak_reserved_bytes`` the whole run replayed through PyTorch's default allocator
    (policy ``torch``), ``peak_total_bytes`` that plus the CUDA context; ``breakdown`` the
    bytes live at the peak by kind; ``phases`` the last step's peak per phase;
    ``step_peaks`` every step's; ``policies`` the reserved peak of each policy; ``replay``
    the full replay (``gpumem replay --json`` of the trace, with any out-of-memory at the
    GPU's capacity); ``mapped`` the CUDA rules applied to the CPU run."""

    steps: int
    amp: str | None
    events: int
    peak_allocated_bytes: int
    peak_requested_bytes: int
    peak_reserved_bytes: int
    peak_total_bytes: int
    peak_step: int
    peak_phase: str
    peak_module: str
    breakdown: dict[str, int]
    phases: list[PhasePeak]
    step_peaks: list[int]
    policies: list[StepPolicy]
    largest_tensors: list[TracedTensor]
    largest_modules: list[ModuleMemory]
    context_bytes: int
    blas_workspace_bytes: int
    mapped: list[str]
    seconds: float
    replay: Replay
    gpu: GpuVerdict | None = None
