"""gpumem.torch and gpumem.cupy against stand-in torch and cupy modules that record what they
are asked (no PyTorch or CuPy is installed here)."""

from __future__ import annotations

import ctypes
import sys
import types

import pytest

import gpumem
import gpumem.cupy as gc
import gpumem.torch as gt
from gpumem import _gpumem


class Recorder:
    """A stand-in torch: torch.cuda.memory.CUDAPluggableAllocator, change_current_allocator,
    torch.cuda.is_initialized, torch.cuda.MemPool."""

    def __init__(self, initialized: bool = False) -> None:
        self.calls: list[tuple] = []
        self.initialized = initialized
        recorder = self

        class Pluggable:
            def __init__(self, path, alloc_fn_name, free_fn_name):
                recorder.calls.append(("CUDAPluggableAllocator", path, alloc_fn_name, free_fn_name))
                self.names = (alloc_fn_name, free_fn_name)

            def allocator(self):
                return ("raw allocator", self.names[0])

        def change_current_allocator(allocator):
            recorder.calls.append(("change_current_allocator", allocator.names))

        def mem_pool(allocator):
            recorder.calls.append(("MemPool", allocator))
            return "a MemPool"

        memory = types.SimpleNamespace(CUDAPluggableAllocator=Pluggable,
                                       change_current_allocator=change_current_allocator)
        cuda = types.SimpleNamespace(memory=memory, MemPool=mem_pool,
                                     is_initialized=lambda: recorder.initialized,
                                     current_device=lambda: 0)
        self.module = types.SimpleNamespace(cuda=cuda)


@pytest.fixture
def fake_torch(monkeypatch):
    recorder = Recorder()
    monkeypatch.setitem(sys.modules, "torch", recorder.module)
    monkeypatch.setattr(gt, "_allocators", {})
    monkeypatch.setattr(gt, "_installed", False)
    yield recorder
    _gpumem.configure("gpumem", "none", "none", 0)


def test_use_installs_the_library_as_pytorchs_allocator_with_the_settings(fake_torch):
    gt.use(policy="torch", hard_limit="1GiB", history=100)
    path = gt.library_path()
    assert fake_torch.calls == [
        ("CUDAPluggableAllocator", path, "gpumem_torch_alloc", "gpumem_torch_free"),
        ("change_current_allocator", ("gpumem_torch_alloc", "gpumem_torch_free")),
    ]
    lib = ctypes.CDLL(path)
    assert lib.gpumem_torch_alloc and lib.gpumem_torch_free, "PyTorch finds both symbols"
    assert gt.policy() == "torch"
    assert "hard = 1024.00 MiB" in gt.memory_summary()
    # A second call changes settings only.
    gt.use(hard_limit="none")
    assert len(fake_torch.calls) == 2
    assert "hard = none" in gt.memory_summary()


def test_use_after_cuda_started_is_a_clear_error_and_installs_nothing(fake_torch):
    fake_torch.initialized = True
    with pytest.raises(gpumem.GpumemError, match="CUDA is already initialised.*before the first"):
        gt.use()
    assert fake_torch.calls == []


def test_a_bad_setting_raises_before_pytorch_is_touched(fake_torch):
    with pytest.raises(gpumem.GpumemError, match="hard limit.*accepted"):
        gt.use(hard_limit="seventy gigs")
    with pytest.raises(gpumem.GpumemError, match="unknown pool policy.*accepted"):
        gt.use(policy="fastest")
    assert fake_torch.calls == []


def test_mempool_is_a_torch_mempool_over_the_null_returning_entry_point(fake_torch):
    fake_torch.initialized = True  # works after CUDA started
    assert gt.mempool(soft_limit="2GiB") == "a MemPool"
    assert fake_torch.calls == [
        ("CUDAPluggableAllocator", gt.library_path(), "gpumem_torch_pool_alloc",
         "gpumem_torch_free"),
        ("MemPool", ("raw allocator", "gpumem_torch_pool_alloc")),
    ]


def test_stats_summary_snapshot_and_limits_through_gpumem_torch(fake_torch, tmp_path):
    gt.set_limits(hard_limit=32 << 20)
    gt.record_history(100)
    ptr = _gpumem.alloc(1 << 20)
    assert gt.memory_stats()["allocated_bytes.all.current"] >= 1 << 20
    with pytest.raises(gpumem.OutOfMemoryError):
        _gpumem.alloc(64 << 20)
    assert "32.00 MiB" in gt.last_oom()
    gt.snapshot(tmp_path / "s.pickle")
    assert (tmp_path / "s.pickle").stat().st_size > 0
    _gpumem.free(ptr, 1 << 20)
    gt.reset_peak_memory_stats()
    assert gt.memory_stats()["allocated_bytes.all.peak"] == 0
    assert gt.empty_cache() > 0


class FakeCupy:
    """A stand-in cupy with what gpumem.cupy uses."""

    def __init__(self) -> None:
        self.allocator = None

        class OutOfMemoryError(MemoryError):
            pass

        class UnownedMemory:
            def __init__(self, ptr, size, owner, device_id):
                self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id

        class MemoryPointer:
            def __init__(self, mem, offset):
                self.mem, self.ptr = mem, mem.ptr + offset

        def set_allocator(allocator):
            self.allocator = allocator

        self.cuda = types.SimpleNamespace(
            Device=lambda: types.SimpleNamespace(id=0),
            get_current_stream=lambda: types.SimpleNamespace(ptr=0x5),
            UnownedMemory=UnownedMemory, MemoryPointer=MemoryPointer,
            set_allocator=set_allocator,
            memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError),
        )


def test_cupy_use_allocates_from_gpumem_frees_on_release_and_explains_an_oom(monkeypatch):
    cupy = FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    gc.use(hard_limit="16MiB")
    try:
        assert cupy.allocator is gc.allocator
        before = gt.memory_stats(0)["allocation.all.current"]
        pointer = cupy.allocator(4096)
        assert pointer.ptr and gt.memory_stats(0)["allocation.all.current"] == before + 1
        del pointer
        assert gt.memory_stats(0)["allocation.all.current"] == before
        with pytest.raises(cupy.cuda.memory.OutOfMemoryError) as raised:
            cupy.allocator(64 << 20)
        assert isinstance(raised.value.__cause__, gpumem.OutOfMemoryError)
        assert "16.00 MiB" in str(raised.value.__cause__)
    finally:
        _gpumem.configure(None, None, "none", None)


def test_device_arguments_are_ordinals_cuda_strings_or_cuda_devices(fake_torch):
    cuda1 = types.SimpleNamespace(type="cuda", index=1)
    assert [gt._device(d) for d in (None, 0, 2, "cuda", "cuda:3", cuda1)] == [0, 0, 2, 0, 3, 1]
    for bad in ("cuda:x", "cpu", "cuda:-1", -1):
        with pytest.raises(ValueError, match=r"accepted: a CUDA device number .* 'cuda:N'"):
            gt.memory_stats(bad)
    for bad in (True, 1.7, types.SimpleNamespace(type="cpu", index=None)):
        with pytest.raises(TypeError, match="accepted: a CUDA device number"):
            gt.memory_stats(bad)


def test_negative_counts_and_crossed_limits_name_the_argument(fake_torch):
    with pytest.raises(ValueError, match="history -1: accepted: a whole number, 0 or more"):
        gt.use(history=-1)
    with pytest.raises(ValueError, match="events -5: accepted"):
        gt.record_history(-5)
    with pytest.raises(gpumem.GpumemError,
                       match='soft limit="3.00 GiB" is not valid: above the hard limit 2.00 GiB'):
        gt.use(soft_limit="3GiB", hard_limit="2GiB")
    with pytest.raises(gpumem.ReplayError, match="device -1: accepted: a whole number"):
        gpumem.replay(device=-1)
    with pytest.raises(gpumem.ReplayError, match="max_replays -1: accepted"):
        gpumem.tune(b"", max_replays=-1)
    with pytest.raises(TypeError, match="top '3': accepted"):
        gpumem.tune(b"", top="3")
    with pytest.raises(ValueError, match="bytes_per_block -1: accepted"):
        gpumem.selftest(bytes_per_block=-1)
