"""PyTorch on gpumem's caching pool.

Three lines switch PyTorch's CUDA allocator to gpumem (before the first CUDA tensor)::

    import gpumem.torch
    gpumem.torch.use(hard_limit="70GiB", history=100_000)
    model = model.cuda()  # allocations now come from gpumem's pool

The library PyTorch loads is this package's extension module itself (``library_path()``), so
the functions here — :func:`memory_stats`, :func:`memory_summary`, :func:`empty_cache`,
:func:`snapshot`, :func:`set_limits` — read and steer the very pools PyTorch allocates from,
giving back what PyTorch's pluggable-allocator path loses (``torch.cuda.memory_stats``,
``empty_cache`` and snapshots fail or do nothing there). An allocation that does not fit
raises ``torch.OutOfMemoryError`` carrying gpumem's explanation.

:func:`mempool` instead routes only some allocations (a KV cache, say) to gpumem through
``torch.cuda.MemPool`` and ``torch.cuda.use_mem_pool``, and works after CUDA has started.
"""

from __future__ import annotations

import os
from typing import Any

from gpumem import _gpumem
from gpumem._gpumem import GpumemError

__all__ = [
    "library_path", "use", "mempool", "memory_stats", "memory_summary", "empty_cache",
    "snapshot", "record_history", "set_limits", "last_oom", "reset_peak_memory_stats", "policy",
    "publish",
]

ALLOC_FUNCTION = "gpumem_torch_alloc"
"""The allocation function PyTorch's allocator calls; it throws on failure."""
POOL_ALLOC_FUNCTION = "gpumem_torch_pool_alloc"
"""The allocation function for a MemPool; it returns NULL on failure, as PyTorch expects there."""
FREE_FUNCTION = "gpumem_torch_free"
"""The free function."""

_allocators: dict[str, Any] = {}
_installed = False


def library_path() -> str:
    """The shared library with gpumem's C entry points: the extension module's own file."""
    return os.path.abspath(_gpumem.__file__)


def _limit(value: str | int | None) -> str | None:
    return None if value is None else str(value)


def _configure(policy: str | None, soft_limit: str | int | None, hard_limit: str | int | None,
               history: int | None) -> None:
    _gpumem.configure(policy, _limit(soft_limit), _limit(hard_limit), history)


def _pluggable(alloc_function: str) -> Any:
    """PyTorch's CUDAPluggableAllocator over this library, made once per function."""
    import torch

    if alloc_function not in _allocators:
        _allocators[alloc_function] = torch.cuda.memory.CUDAPluggableAllocator(
            library_path(), alloc_function, FREE_FUNCTION
        )
    return _allocators[alloc_function]


def use(policy: str | None = None, *, soft_limit: str | int | None = None,
        hard_limit: str | int | None = None, history: int | None = None) -> None:
    """Makes gpumem PyTorch's CUDA allocator for this process.

    ``policy`` is ``"expandable"`` (the default), ``"torch"``, ``"gpumem"`` or ``"none"``;
    limits take the ``GPUMEM_*_LIMIT`` forms (``"70GiB"``, ``"80GB"``, ``"90%"``, bytes, or
    ``"none"``); ``history`` is the number of events recorded for :func:`snapshot` (0: off).
    Settings left as None come from the environment (``GPUMEM_POOL``, ``GPUMEM_HARD_LIMIT``, …).
    A bad value raises GpumemError and changes nothing.

    Must run before CUDA is initialised in this process (before the first CUDA tensor or
    ``torch.cuda`` call that starts CUDA): PyTorch cannot swap an allocator in use, and then
    this raises GpumemError saying so. Calling it again after it succeeded only changes the
    settings (the policy only while nothing is allocated).
    """
    global _installed
    import torch

    if _installed:
        _configure(policy, soft_limit, hard_limit, history)
        return
    if torch.cuda.is_initialized():
        raise GpumemError(
            "CUDA is already initialised in this process, so PyTorch's allocator can no longer "
            "be replaced: call gpumem.torch.use() before the first CUDA tensor or CUDA call "
            "(or use gpumem.torch.mempool(), which works afterwards)"
        )
    _configure(policy, soft_limit, hard_limit, history)
    try:
        torch.cuda.memory.change_current_allocator(_pluggable(ALLOC_FUNCTION))
    except RuntimeError as error:
        raise GpumemError(f"PyTorch refused gpumem as its allocator: {error}") from error
    _installed = True


def mempool(policy: str | None = None, *, soft_limit: str | int | None = None,
            hard_limit: str | int | None = None, history: int | None = None) -> Any:
    """A ``torch.cuda.MemPool`` whose memory comes from gpumem, for routing some allocations::

        pool = gpumem.torch.mempool(hard_limit="20GiB")
        with torch.cuda.use_mem_pool(pool):
            kv_cache = torch.empty(..., device="cuda")

    Works after CUDA has started. PyTorch's caching allocator keeps managing the pool's
    blocks and asks gpumem for its segments; when gpumem refuses one, PyTorch frees its cache,
    retries and raises ``torch.OutOfMemoryError`` (gpumem's explanation: :func:`last_oom`).
    Settings as in :func:`use`.
    """
    import torch

    _configure(policy, soft_limit, hard_limit, history)
    return torch.cuda.MemPool(_pluggable(POOL_ALLOC_FUNCTION).allocator())


def _device(device: int | Any | None) -> int:
    """A device ordinal: an int, a torch.device, or None for the current CUDA device (0 before
    CUDA starts)."""
    if device is None:
        import torch

        return torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    index = getattr(device, "index", device)
    return 0 if index is None else int(index)


def memory_stats(device: int | Any | None = None) -> dict[str, int]:
    """gpumem's statistics for ``device`` with ``torch.cuda.memory_stats()``'s keys
    (``allocated_bytes.all.current``, ``reserved_bytes.all.peak``, ``num_alloc_retries``,
    ``num_ooms``, …, plus ``device_calls.*``)."""
    return _gpumem.memory_stats(_device(device))


def memory_summary(device: int | Any | None = None) -> str:
    """A human summary of ``device``'s pool: usage, limits, fragmentation."""
    return _gpumem.pool_status(_device(device))


def empty_cache(device: int | Any | None = None) -> int:
    """Gives ``device``'s cached memory back to the GPU (``torch.cuda.empty_cache()`` does
    nothing for a pluggable allocator); returns the bytes released."""
    return _gpumem.empty_cache(_device(device))


def reset_peak_memory_stats(device: int | Any | None = None) -> None:
    """Sets every peak statistic of ``device`` to its current value."""
    _gpumem.reset_peak_stats(_device(device))


def snapshot(path: str | os.PathLike[str], device: int | Any | None = None) -> None:
    """Writes ``device``'s pool as a PyTorch memory snapshot (a pickle that
    https://pytorch.org/memory_viz opens; JSON when the name ends in ``.json``), with the
    history recorded since ``use(history=N)`` or :func:`record_history`."""
    _gpumem.snapshot(os.fspath(path), _device(device))


def record_history(events: int, device: int | Any | None = None) -> None:
    """Starts recording ``events`` allocation events of ``device`` for :func:`snapshot`
    (0 stops)."""
    _gpumem.set_history(events, _device(device))


def set_limits(soft_limit: str | int | None = None, hard_limit: str | int | None = None,
               device: int | Any | None = None) -> None:
    """Changes ``device``'s limits now (None leaves a limit as it is, ``"none"`` removes it):
    cached memory above the soft limit is released at synchronisation points, reserved memory
    never exceeds the hard limit (cached memory above a lowered one is released at once)."""
    _gpumem.set_limits(_device(device), _limit(soft_limit), _limit(hard_limit))


def last_oom(device: int | Any | None = None) -> str | None:
    """The explanation of ``device``'s last out-of-memory: what was asked, held and free, and
    what to try."""
    return _gpumem.last_oom(_device(device))


def policy(device: int | Any | None = None) -> str:
    """The policy ``device``'s pool runs."""
    return _gpumem.policy(_device(device))


def publish(dir: str | os.PathLike[str] | None = None) -> str:
    """Makes this process's gpumem pools visible to ``gpumem top``, ``gpumem diagnose --pid``
    and ``gpumem exporter``: a Unix socket ``<dir>/<pid>.sock`` that answers their statistics
    (allocated, reserved, fragmentation, OOMs, policy, limits) when asked, and costs nothing
    otherwise. ``dir`` defaults to the directory those tools read (``GPUMEM_PUBLISH_DIR``, else
    ``$XDG_RUNTIME_DIR/gpumem``, else ``<tmp>/gpumem-<uid>``). Returns the socket's path.

    ``GPUMEM_PUBLISH=1`` in the environment does the same when the first pool is made (a value
    other than 1/true/on or 0/false/off is an error then). Publishing twice keeps the first
    endpoint.
    """
    return _gpumem.publish(None if dir is None else os.fspath(dir))
