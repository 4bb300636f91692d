"""Per-step memory figures of a training loop, logged where the user already looks.

:class:`StepLogger` reads, at each step, the bytes allocated and reserved and how fragmented
the cache is — from gpumem's pool when gpumem is the allocator (:func:`gpumem.torch.use`, or
``source="gpumem"``), from ``torch.cuda.memory_stats()`` otherwise — and sends them to a Python
:mod:`logging` logger, to TensorBoard (any object with ``add_scalar(tag, value, step)``, such
as ``torch.utils.tensorboard.SummaryWriter``) and to any ``log_fn(figures, step)`` (for
example ``accelerator.log``). It also runs ``gpumem diagnose``'s rules (the Rust ones, through
the extension) over the recent steps and prints each finding once, the first time it holds::

    from gpumem.watch import StepLogger

    memory = StepLogger(writer=SummaryWriter())
    for batch in loader:
        loss = model(batch).loss
        loss.backward(); optimizer.step(); optimizer.zero_grad()
        memory.step()

For Hugging Face ``Trainer`` use :class:`gpumem.hf.GpumemCallback`, which calls this at each
``on_step_end``.

Fragmentation is the share of the cached bytes (reserved but not allocated) that no large
request can use: for gpumem's pool ``1 - largest free block / cached``; for PyTorch's
allocator, which does not report its largest free block, the share of the cache in free
pieces of split segments (``inactive_split_bytes``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Protocol

from gpumem import _gpumem
from gpumem._gpumem import GpumemError

__all__ = ["StepMemory", "Finding", "StepLogger", "diagnose", "ScalarWriter"]

Source = Literal["auto", "gpumem", "torch"]


class ScalarWriter(Protocol):
    """What :class:`StepLogger` needs of a TensorBoard writer (``SummaryWriter`` has it)."""

    def add_scalar(self, tag: str, scalar_value: float, global_step: int | None = None) -> Any:
        """Records one scalar at a step."""


@dataclass(frozen=True)
class StepMemory:
    """One step's memory figures of one device."""

    step: int
    """The step (the caller's count, or the logger's own)."""
    device: int
    """The CUDA device ordinal."""
    source: str
    """Where the figures come from: ``"gpumem"`` or ``"torch"``."""
    allocated: int
    """Bytes handed out to tensors."""
    reserved: int
    """Bytes the allocator holds from the device."""
    largest_free_block: int
    """The largest cached piece a request could get without asking the device, bytes."""
    policy: str = ""
    """gpumem's pool policy, or ``"torch"``."""

    @property
    def cached(self) -> int:
        """Bytes reserved but not allocated."""
        return max(self.reserved - self.allocated, 0)

    @property
    def fragmentation(self) -> float:
        """0 when the cache is one usable piece (or empty), near 1 when it is splinters."""
        cached = self.cached
        return 0.0 if cached == 0 else 1.0 - min(self.largest_free_block, cached) / cached

    def scalars(self) -> dict[str, float]:
        """The figures logged each step, by name."""
        return {
            "allocated_bytes": float(self.allocated),
            "reserved_bytes": float(self.reserved),
            "fragmentation": self.fragmentation,
        }


@dataclass(frozen=True)
class Finding:
    """One of ``gpumem diagnose``'s findings: a cause that holds, its evidence and advice."""

    kind: str
    """The cause, e.g. ``"fragmentation"``."""
    subject: str
    """What it is about, e.g. ``"pid 4300 on GPU 0"``."""
    evidence: list[str] = field(default_factory=list)
    """The numbers that show it."""
    advice: list[str] = field(default_factory=list)
    """What to do, most promising first."""
    text: str = ""
    """All of it as ``gpumem diagnose`` prints it."""


def diagnose(samples: list[dict[str, Any]], pid: int | None = None) -> list[Finding]:
    """Runs ``gpumem diagnose``'s rules over ``samples`` (dicts in the ``gpumem watch record``
    format: ``time_ms``, ``gpus``, ``pools``), restricted to process ``pid`` when given."""
    found = json.loads(_gpumem.diagnose_json(json.dumps(samples), pid))
    return [Finding(**item) for item in found]


def _torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _gpumem_is_torch_allocator() -> bool:
    import gpumem.torch

    return bool(gpumem.torch._installed)


class StepLogger:
    """Logs each training step's memory figures and prints ``gpumem diagnose``'s findings once.

    Call :meth:`step` after each optimizer step; or use it as a context manager around the
    loop (``with StepLogger(...) as memory: ... memory.step()``), which flushes the writer at
    the end.

    Arguments:
        logger: where the per-step line (INFO) and the findings (WARNING) go; the ``gpumem``
            logger when None (findings then reach stderr even without logging configured).
        writer: a TensorBoard ``SummaryWriter`` (anything with ``add_scalar``), or None.
        log_fn: called as ``log_fn(figures, step)`` with the scalars by name (``accelerator.log``
            takes exactly that), or None.
        device: the CUDA device ordinal; None for PyTorch's current device (0 without CUDA).
        source: ``"gpumem"`` (gpumem's pool), ``"torch"`` (``torch.cuda.memory_stats``), or
            ``"auto"``: gpumem when it is PyTorch's allocator or PyTorch is absent, else torch.
        every: log one step in this many (the figures are read only then).
        prefix: the TensorBoard tag and ``log_fn`` key prefix.
        window: how many logged steps the diagnosis looks back over.
    """

    def __init__(self, logger: logging.Logger | None = None, *,
                 writer: ScalarWriter | None = None,
                 log_fn: Callable[[dict[str, float], int], Any] | None = None,
                 device: int | None = None, source: Source = "auto", every: int = 1,
                 prefix: str = "gpumem/", window: int = 100) -> None:
        if source not in ("auto", "gpumem", "torch"):
            raise GpumemError(f"source={source!r} is not valid; accepted: 'auto', 'gpumem', 'torch'")
        if every < 1 or window < 1:
            raise GpumemError(f"every={every} and window={window} must both be at least 1")
        self.logger = logger or logging.getLogger("gpumem")
        self.writer = writer
        self.log_fn = log_fn
        self.device = device
        self.source = source
        self.every = every
        self.prefix = prefix
        self.steps = 0
        self.last: StepMemory | None = None
        self.reported: set[tuple[str, str]] = set()
        self._window: deque[dict[str, Any]] = deque(maxlen=window)

    def __enter__(self) -> StepLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Flushes the writer, if it has ``flush``."""
        flush = getattr(self.writer, "flush", None)
        if callable(flush):
            flush()

    def _source(self) -> str:
        if self.source != "auto":
            return self.source
        if not _torch_available() or _gpumem_is_torch_allocator():
            return "gpumem"
        return "torch"

    def _device(self) -> int:
        if self.device is not None:
            return self.device
        if _torch_available():
            import torch

            if torch.cuda.is_initialized():
                return int(torch.cuda.current_device())
        return 0

    def read(self, step: int) -> StepMemory:
        """The figures of this device now."""
        device = self._device()
        if self._source() == "gpumem":
            pool = json.loads(_gpumem.pool_sample_json(device))
            return StepMemory(step, device, "gpumem", pool["allocated"], pool["reserved"],
                              pool["largest_free_block"], pool["policy"])
        import torch

        stats = torch.cuda.memory_stats(device)
        allocated = int(stats.get("allocated_bytes.all.current", 0))
        reserved = int(stats.get("reserved_bytes.all.current", 0))
        split = int(stats.get("inactive_split_bytes.all.current", 0))
        cached = max(reserved - allocated, 0)
        return StepMemory(step, device, "torch", allocated, reserved, max(cached - split, 0),
                          "torch")

    def step(self, step: int | None = None) -> StepMemory | None:
        """Records one step (``step``: the caller's count; the logger's own when None): logs
        the figures when it is one of every ``every`` steps, then prints each diagnosis the
        first time it holds. Returns the figures logged, or None for a skipped step."""
        self.steps += 1
        step = self.steps if step is None else int(step)
        if (self.steps - 1) % self.every:
            return None
        memory = self.read(step)
        self.last = memory
        scalars = memory.scalars()
        self.logger.info(
            "step %d: gpumem (%s, device %d): allocated %s, reserved %s, fragmentation %.1f%%",
            step, memory.source, memory.device, _size(memory.allocated), _size(memory.reserved),
            100 * memory.fragmentation,
        )
        if self.writer is not None:
            for name, value in scalars.items():
                self.writer.add_scalar(self.prefix + name, value, step)
        if self.log_fn is not None:
            self.log_fn({self.prefix + name: value for name, value in scalars.items()}, step)
        self._diagnose(memory)
        return memory

    def _diagnose(self, memory: StepMemory) -> None:
        pid = os.getpid()
        self._window.append({
            "time_ms": int(time.time() * 1000),
            "gpus": [],
            "pools": [{
                "pid": pid, "device": memory.device, "policy": memory.policy,
                "allocated": memory.allocated, "reserved": memory.reserved,
                "largest_free_block": memory.largest_free_block,
            }],
        })
        for finding in diagnose(list(self._window), pid):
            key = (finding.kind, finding.subject)
            if key not in self.reported:
                self.reported.add(key)
                self.logger.warning("gpumem diagnose, at step %d:\n%s", memory.step,
                                    finding.text.rstrip())


def _size(n: int) -> str:
    """Bytes in binary units, e.g. ``1.50 GiB``."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    value, unit = float(n), 0
    while value >= 1024 and unit < len(units) - 1:
        value /= 1024
        unit += 1
    return f"{n} B" if unit == 0 else f"{value:.2f} {units[unit]}"
