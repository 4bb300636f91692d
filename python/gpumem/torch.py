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

:func:`trace` plans a model's own training step for a CUDA GPU without one: it runs the step
on fake tensors and replays what it allocates through gpumem's allocator policies.

PyTorch is imported only inside the functions that use it: ``import gpumem.torch`` works
without it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from gpumem.results import StepTrace

from gpumem import _gpumem
from gpumem._args import whole
from gpumem._gpumem import GpumemError

__all__ = [
    "library_path", "use", "mempool", "memory_stats", "memory_summary", "empty_cache",
    "snapshot", "record_history", "set_limits", "last_oom", "reset_peak_memory_stats", "policy",
    "publish", "trace",
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
    _gpumem.configure(policy, _limit(soft_limit), _limit(hard_limit), whole("history", history))


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


_DEVICES_ACCEPTED = "a CUDA device number (0 or more), 'cuda', 'cuda:N' or a torch.device of type cuda"


def _current_device() -> int:
    """The current CUDA device (0 before CUDA starts)."""
    import torch

    return torch.cuda.current_device() if torch.cuda.is_initialized() else 0


def _device(device: int | str | Any | None) -> int:
    """A device ordinal: an int, ``"cuda"``/``"cuda:N"``, a torch.device of type cuda, or None
    for the current CUDA device (0 before CUDA starts); anything else is an error saying what
    is accepted."""
    if device is None:
        return _current_device()
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind != "cuda" or (index and not index.isdigit()):
            raise ValueError(f"device {device!r}: accepted: {_DEVICES_ACCEPTED}")
        return int(index) if index else _current_device()
    if isinstance(device, int) and not isinstance(device, bool):
        if device < 0:
            raise ValueError(f"device {device}: accepted: {_DEVICES_ACCEPTED}")
        return device
    if getattr(device, "type", None) == "cuda" and hasattr(device, "index"):  # a torch.device
        return _current_device() if device.index is None else device.index
    raise TypeError(f"device {device!r}: accepted: {_DEVICES_ACCEPTED}")


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
    _gpumem.set_history(whole("events", events), _device(device))


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


def trace(model: Any, example_inputs: dict[str, Any] | tuple[Any, ...], *, optimizer: Any = None,
          loss_fn: Callable[[Any], Any] | None = None, steps: int = 2, amp: str | None = None,
          gpu: str | int | None = None, top: int = 10,
          trace_out: str | os.PathLike[str] | None = None) -> StepTrace:
    """Plans the GPU memory of ``model``'s own training step on a CUDA GPU — without a GPU and
    without real memory: the step runs on PyTorch's fake tensors (``FakeTensorMode``), every
    storage it creates and frees is recorded, and that sequence is replayed through gpumem's
    allocator policies as ``gpumem plan`` replays its own::

        import gpumem.torch
        result = gpumem.torch.trace(model, {"input_ids": ids, "labels": ids},
                                    optimizer=torch.optim.AdamW(model.parameters()),
                                    amp="bf16", gpu="rtx-4090")
        print(result.peak_allocated_bytes, result.peak_reserved_bytes, result.gpu.fits)
        for t in result.largest_tensors: print(t.bytes, t.kind, t.module, t.name or t.op)

    ``example_inputs`` is a dict of keyword arguments (``model(**inputs)``) or a tuple of
    positional ones. A step is: the inputs copied to the device, the forward, the loss
    (``loss_fn(output)`` if given, else ``output.loss``, else the output itself, a scalar),
    ``backward()``, ``optimizer.step()`` and ``zero_grad(set_to_none=True)`` (the model's
    ``zero_grad`` without an optimizer); its outputs and loss are dropped after the backward,
    before the optimizer step. Without an optimizer, a loss that needs no gradient traces the
    forward alone (inference). ``steps`` such
    steps run (2 by default: optimizer states are made in the first step) and the peak is the
    last step's. ``amp`` runs the forward and loss under autocast in ``"bf16"`` or ``"fp16"``.
    ``gpu`` is a catalogue name or a size as for ``gpumem plan --gpu`` (``"h100"``,
    ``"24GiB"``), or a size in bytes: the fit is checked there, with its cuBLAS workspace and the planner's CUDA
    context. ``trace_out`` writes the recorded sequence as a gpumem trace (``gpumem replay``,
    ``gpumem tune`` and ``gpumem report`` read it). ``top`` is the number of tensors and
    modules listed at the peak.

    The model, optimizer and inputs may be on the CPU (the model in the mode you set:
    ``train()`` for dropout): they are copied to fake tensors (the model by ``deepcopy``
    under ``FakeCopyMode``, the optimizer rebuilt as its class over the fake parameters with
    its groups, settings and state); nothing of yours is modified and no memory is allocated.
    Parameters, buffers, existing gradients and optimizer states are live from the start;
    the rest is recorded as PyTorch's dispatcher creates it.

    **What is mapped to CUDA** (the step runs on CPU fake tensors, which take the CPU's
    paths): storages rounded to CUDA's 512-byte blocks; cuBLAS's workspace allocated at the
    first matrix product of the forward and of the backward (the autograd engine's thread);
    dropout as CUDA's fused kernel (1-byte mask); ``scaled_dot_product_attention`` as CUDA
    chooses on ``gpu``'s generation (cuDNN first on Hopper and Blackwell for fp16/bf16, head
    dims up to 128 and a mask without gradient; flash from Ampere on for fp16/bf16 without a
    mask; memory-efficient for masks and fp32; math otherwise, and for a mask whose last
    dimension is strided), run through those kernels' own operators, whose outputs fake
    tensors size as on CUDA; memory kernels take inside themselves, as ``temporary``
    allocations around the operator: flash attention's backward accumulators, a bias
    gradient's column-sum staging (on the GPU's multiprocessors), cuDNN's convolution
    workspaces (half precision, and fp32 from Ampere on); ``softmax(fp16, dtype=float32)`` as
    the fused ``half_to_float`` kernel; autocast with CUDA's fp32 op lists; an optimizer left
    to PyTorch's default runs ``foreach`` (CUDA's default); its step counters stay in host
    memory.

    **What is not**: other memory kernels allocate inside themselves (cuDNN attention's and
    the memory-efficient kernel's backward workspaces, other reductions, transposed or grouped
    convolutions), in-place dropout (CPU's noise tensor, as on CUDA), SDPA choices that
    depend on the build (cuDNN's version, FlashAttention-3, ROCm), and anything the step puts
    on another device or in host memory besides step counters.
    Tensors created outside PyTorch's dispatcher are seen only when an operator returns
    them. Refused with a clear error: sparse tensors (fake ones hold none of their entries),
    code that reads tensor values in the forward or loss (``.item()``, ``if t.max() > x``,
    ``nonzero()``: fake tensors have no values), and an optimizer whose ``step`` needs a
    closure (LBFGS). Needs PyTorch 2.1 or later; raises what the step raises.
    """
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise ImportError("gpumem.torch.trace needs PyTorch (2.1 or later): pip install torch "
                          "(a CPU build is enough)")
    from gpumem import _torch_trace

    return _torch_trace.trace(model, example_inputs, optimizer=optimizer, loss_fn=loss_fn,
                              steps=steps, amp=amp, gpu=gpu, top=top, trace_out=trace_out)
