"""gpumem: predictable GPU memory for deep learning.

- :func:`plan` / :func:`fit` predict the peak memory per GPU of a training or inference run and
  find the batch that fits (no GPU needed);
- :func:`replay` replays an allocation trace (a file, its bytes, or a snapshot dict straight
  from ``torch.cuda.memory._snapshot()``) through gpumem's allocator policies; :func:`tune`
  searches PyTorch's allocator options for it; :func:`report` draws it as an HTML page;
- :func:`policies`, :func:`devices` and :func:`selftest` say what is here and check it;
- :mod:`gpumem.torch` and :mod:`gpumem.cupy` run PyTorch and CuPy on gpumem's caching pool.

Every call runs in this process, in the Rust library the ``gpumem`` command runs, and returns
a typed result (a frozen dataclass of :mod:`gpumem.results`) whose fields are the command's ``--json`` fields;
``result.to_dict()`` is that JSON. Bad arguments raise :class:`PlanError`,
:class:`TraceError` or :class:`ReplayError` (all :class:`GpumemError`) with the command's
message.
"""

import json as _json
import os as _os
import pickle as _pickle
from typing import Any as _Any, Iterable as _Iterable, Mapping as _Mapping, Union as _Union

from gpumem import _gpumem
from gpumem._args import whole as _whole
from gpumem._gpumem import GpumemError, OutOfMemoryError, PlanError, ReplayError, TraceError
from gpumem import results
from gpumem.results import (
    Devices,
    Plan,
    Policy,
    Replay,
    Selftest,
    Tune,
)

__all__ = [
    "Devices",
    "GpumemError",
    "NothingFitsError",
    "OutOfMemoryError",
    "Plan",
    "PlanError",
    "Policy",
    "Replay",
    "ReplayError",
    "Selftest",
    "TraceError",
    "TraceSource",
    "Tune",
    "devices",
    "fit",
    "plan",
    "policies",
    "replay",
    "report",
    "results",
    "selftest",
    "tune",
]
__version__ = "0.1.0"

#: What a trace may be given as: a file's path, a file's bytes, or a PyTorch memory snapshot
#: as ``torch.cuda.memory._snapshot()`` returns it.
TraceSource = _Union[str, "_os.PathLike[str]", bytes, _Mapping[str, _Any]]


class NothingFitsError(PlanError):
    """A fit for which not even the smallest batch or sequence fits; ``plan`` is the plan as
    asked for, with its advice and the plan that fits (the command prints it before failing).
    """

    def __init__(self, message: str, plan: Plan) -> None:
        super().__init__(message)
        self.plan = plan


def plan(model: str | None = None, *, config: str | _os.PathLike[str] | None = None,
         reserved: str = "replay", **settings: _Any) -> Plan:
    """Predicts the peak memory per GPU of a run: ``gpumem plan --json``, in-process.

    ``model`` is a catalogue name or Hugging Face id, or ``config`` a path to a Hugging Face
    config.json. ``settings`` are the command's flags by name (``mode="train"``, ``batch=4``,
    ``seq=2048``, ``amp="bf16"``, ``grad_ckpt=True``, ``gpu="a100-80gb"``, ``zero="3"``,
    ``gpus=8``, ``fit="batch"``, ``min_gpus=True``, …; ``python -m gpumem plan --help`` lists
    them); a name that is not one raises :class:`PlanError` naming the nearest.
    ``reserved="estimate"`` skips the allocator replay (microseconds instead of tens of
    milliseconds: for sweeps over thousands of configurations).

    Raises :class:`NothingFitsError` when a fit finds nothing (its ``plan`` holds the rest).
    """
    request = {"model": model, "config": config, "reserved": reserved, **settings}
    request = {k: v for k, v in request.items() if v is not None}
    text = _json.dumps(request, default=_os.fspath)
    result = Plan.from_dict(_json.loads(_gpumem.plan(text)))
    if result.fit_error is not None:
        raise NothingFitsError(result.fit_error, result)
    return result


def fit(model: str | None = None, *, gpu: str, target: str = "batch", **settings: _Any) -> Plan:
    """Finds the largest ``target`` (``"batch"`` or ``"seq"``) that fits ``gpu`` (a name such
    as ``"h100"`` or a size such as ``"24GiB"``): :func:`plan` with ``fit=target``; the
    result's ``fit`` holds the value, usable bytes and accumulation."""
    return plan(model, gpu=gpu, fit=target, **settings)


def _source(trace: TraceSource, format: str) -> tuple[_Any, str]:
    """A trace as the extension takes it (a path or bytes), and its format: a snapshot dict
    is pickled in memory, as PyTorch's ``_dump_snapshot`` writes it."""
    if isinstance(trace, _Mapping):
        return _pickle.dumps(dict(trace)), "pytorch" if format == "auto" else format
    if isinstance(trace, (bytes, bytearray, memoryview)):
        return bytes(trace), format
    if isinstance(trace, (str, _os.PathLike)):
        return _os.fspath(trace), format
    raise TypeError(
        f"a trace is a path, bytes or a snapshot dict, not {type(trace).__name__}"
    )


def _names(policies: str | _Iterable[str]) -> list[str]:
    return [policies] if isinstance(policies, str) else list(policies)


def _size(capacity: str | int | None) -> str | None:
    return None if capacity is None else str(capacity)


def replay(trace: TraceSource | None = None, *, policies: str | _Iterable[str] = "all",
           capacity: str | int | None = None, format: str = "auto", device: int | None = None,
           pytorch_alloc_conf: str | None = None, gpumem_policy_conf: str | None = None,
           smallest_capacity: bool = False) -> Replay:
    """Replays an allocation trace through gpumem's policies: ``gpumem replay --json``.

    ``trace`` is a file (gpumem JSON lines, a PyTorch snapshot pickle, an RMM log; gzip or
    not), its bytes, a snapshot dict as ``torch.cuda.memory._snapshot()`` returns it (nothing
    is written to disk), or None for the bundled GPT-2 training trace. ``policies`` is
    ``"all"``, one name or several; ``capacity`` a device size (``"24GiB"`` or bytes) to check
    for out-of-memory; ``device`` the snapshot's device; ``smallest_capacity`` also finds the
    smallest device each policy runs on.
    """
    source, format = (None, format) if trace is None else _source(trace, format)
    text = _gpumem.replay(
        source, format=format, device=_whole("device", device, ReplayError), name="snapshot",
        policies=_names(policies),
        capacity=_size(capacity), pytorch_alloc_conf=pytorch_alloc_conf,
        gpumem_policy_conf=gpumem_policy_conf, smallest_capacity=smallest_capacity)
    return Replay.from_dict(_json.loads(text))


def tune(trace: TraceSource, *, capacity: str | int | None = None, objective: str = "reserved",
         top: int = 3, max_replays: int | None = None, format: str = "auto",
         device: int | None = None) -> Tune:
    """Searches PyTorch's allocator options (PYTORCH_CUDA_ALLOC_CONF) for ``trace``:
    ``gpumem tune --json``. ``objective`` is ``"reserved"``, ``"fit"`` or ``"calls"``; the
    ``top`` settings come best first, with PyTorch's defaults and gpumem's policy beside."""
    source, format = _source(trace, format)
    text = _gpumem.tune(source, format=format, device=_whole("device", device, ReplayError),
                        name="snapshot", capacity=_size(capacity), objective=objective,
                        top=_whole("top", top, ReplayError),
                        max_replays=_whole("max_replays", max_replays, ReplayError))
    return Tune.from_dict(_json.loads(text))


def report(traces: TraceSource | list[TraceSource], output: str | _os.PathLike[str] | None = None,
           *, policies: str | _Iterable[str] = "all", capacity: str | int | None = None,
           tune: bool = False, format: str = "auto", device: int | None = None,
           pytorch_alloc_conf: str | None = None,
           gpumem_policy_conf: str | None = None) -> str:
    """The HTML report of ``traces`` (one trace, or a list: the ranks of a job) as
    ``gpumem report`` writes it: charts, segment maps, where each policy would run out of
    memory. With ``output``, writes the page there and returns its path; without, returns the
    page (for a notebook: ``IPython.display.HTML(gpumem.report(t))``)."""
    listed = traces if isinstance(traces, list) else [traces]
    read = [_source(trace, format) for trace in listed]
    # A snapshot dict is read as a PyTorch snapshot; the traces of a job share one format.
    formats = {trace_format for _, trace_format in read} or {format}
    page = _gpumem.report(
        [source for source, _ in read], format=formats.pop() if len(formats) == 1 else format,
        device=_whole("device", device, ReplayError),
        policies=_names(policies), capacity=_size(capacity),
        pytorch_alloc_conf=pytorch_alloc_conf, gpumem_policy_conf=gpumem_policy_conf,
        tune=tune)
    if output is None:
        return page
    with open(output, "w", encoding="utf-8") as out:
        out.write(page)
    return _os.fspath(output)


def policies() -> list[Policy]:
    """The built-in allocator policies, what each is, and which is the default."""
    return [Policy.from_dict(p) for p in _json.loads(_gpumem.policies())]


def devices() -> Devices:
    """Every device of every backend here (the simulated one always), and for each backend
    without one, why."""
    return Devices.from_dict(_json.loads(_gpumem.devices()))


def selftest(*, backend: str = "sim", device: int = 0, policies: str | _Iterable[str] = "all",
             trace: TraceSource | None = None, bytes_per_block: int | None = None) -> Selftest:
    """Checks the pool on ``device`` of ``backend`` (``"sim"`` or ``"cuda"``) with real bytes:
    every policy of ``policies``, round trips and a real trace (``trace``, or a bundled one).
    The result's ``passed`` says whether every check held."""
    source = None if trace is None else _source(trace, "auto")[0]
    text = _gpumem.selftest(backend=backend, device=_whole("device", device),
                            policies=_names(policies), trace=source,
                            bytes_per_block=_whole("bytes_per_block", bytes_per_block))
    return Selftest.from_dict(_json.loads(text))
