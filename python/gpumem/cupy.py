"""CuPy on gpumem's caching pool::

    import gpumem.cupy
    gpumem.cupy.use(hard_limit="20GiB")
    x = cupy.zeros((1 << 28,), dtype=cupy.float32)  # from gpumem's pool

Each allocation goes through gpumem's C entry points (``gpumem_cupy_malloc``/``gpumem_cupy_free``,
the functions a ``cupy.cuda.CFunctionAllocator`` would call); this module wraps them as a
CuPy allocator so that an allocation that does not fit raises CuPy's own
``cupy.cuda.memory.OutOfMemoryError`` from a ``gpumem.OutOfMemoryError`` carrying gpumem's
explanation (its ``__cause__``), which a bare C function cannot do. Statistics, limits and snapshots: the functions of
:mod:`gpumem.torch` work for CuPy's pools as well (they are the same pools).
"""

from __future__ import annotations

from typing import Any

from gpumem import _gpumem
from gpumem._gpumem import OutOfMemoryError
from gpumem.torch import _configure, library_path

__all__ = ["use", "allocator", "library_path", "MALLOC_FUNCTION", "FREE_FUNCTION"]

MALLOC_FUNCTION = "gpumem_cupy_malloc"
"""CuPy ``CFunctionAllocator``'s allocation function in :func:`library_path`."""
FREE_FUNCTION = "gpumem_cupy_free"
"""CuPy ``CFunctionAllocator``'s free function in :func:`library_path`."""


class _Block:
    """Owns one gpumem allocation; frees it when CuPy drops the memory."""

    def __init__(self, ptr: int, device: int) -> None:
        self.ptr = ptr
        self.device = device

    def __del__(self) -> None:
        if self.ptr:
            _gpumem.free(self.ptr, None, self.device)
            self.ptr = 0


def allocator(size: int) -> Any:
    """A CuPy allocator function: ``size`` bytes of gpumem's pool on CuPy's current device,
    as a ``cupy.cuda.MemoryPointer``. When it does not fit, raises
    ``cupy.cuda.memory.OutOfMemoryError`` from ``gpumem.OutOfMemoryError`` (the explanation)."""
    import cupy

    device = cupy.cuda.Device().id
    stream = cupy.cuda.get_current_stream().ptr
    try:
        ptr = _gpumem.alloc(size, device, stream)
    except OutOfMemoryError as error:
        raise cupy.cuda.memory.OutOfMemoryError(size, 0, 0) from error
    block = _Block(ptr, device)
    memory = cupy.cuda.UnownedMemory(ptr, size, block, device)
    return cupy.cuda.MemoryPointer(memory, 0)


def use(policy: str | None = None, *, soft_limit: str | int | None = None,
        hard_limit: str | int | None = None, history: int | None = None) -> None:
    """Makes gpumem CuPy's allocator (``cupy.cuda.set_allocator``); settings as
    :func:`gpumem.torch.use`. Memory allocated before stays with CuPy's own pool."""
    import cupy

    _configure(policy, soft_limit, hard_limit, history)
    cupy.cuda.set_allocator(allocator)
