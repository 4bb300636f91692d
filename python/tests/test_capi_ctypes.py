"""The C ABI as PyTorch and CuPy reach it: ctypes over the extension module's own file, on the
simulated device. Each test leaves no live allocation behind (the pools are per process)."""

from __future__ import annotations

import ctypes
import json
import os
import pickle
import threading

import pytest

import gpumem
import gpumem.torch as gt
from gpumem import _gpumem

OK, OOM, INVALID, UNKNOWN, SIZE_MISMATCH, CONFIG = 0, 1, 2, 3, 4, 5
MIB = 1 << 20


def library() -> ctypes.CDLL:
    lib = ctypes.CDLL(gt.library_path())
    vp, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    lib.gpumem_torch_alloc.restype = vp
    lib.gpumem_torch_alloc.argtypes = [sz, i, vp]
    lib.gpumem_torch_free.restype = None
    lib.gpumem_torch_free.argtypes = [vp, sz, i, vp]
    lib.gpumem_cupy_malloc.restype = vp
    lib.gpumem_cupy_malloc.argtypes = [vp, sz, i]
    lib.gpumem_cupy_free.restype = None
    lib.gpumem_cupy_free.argtypes = [vp, vp, i]
    lib.gpumem_free.argtypes = [vp, sz, i]
    lib.gpumem_last_error.restype = ctypes.c_char_p
    lib.gpumem_memory_stats.restype = sz
    lib.gpumem_memory_stats.argtypes = [i, ctypes.c_char_p, sz]
    lib.gpumem_last_oom.restype = sz
    lib.gpumem_last_oom.argtypes = [i, ctypes.c_char_p, sz]
    lib.gpumem_set_limits.argtypes = [i, ctypes.c_char_p, ctypes.c_char_p]
    lib.gpumem_snapshot.argtypes = [i, ctypes.c_char_p]
    lib.gpumem_set_history.argtypes = [i, sz]
    lib.gpumem_empty_cache.argtypes = [i, ctypes.POINTER(ctypes.c_uint64)]
    return lib


LIB = library()


def text(function, device: int) -> str:
    need = function(device, None, 0)
    assert need > 0, LIB.gpumem_last_error()
    buffer = ctypes.create_string_buffer(need)
    assert function(device, buffer, need) == need
    return buffer.value.decode()


def stats(device: int) -> dict[str, int]:
    return json.loads(text(LIB.gpumem_memory_stats, device))


def last_error() -> str:
    return LIB.gpumem_last_error().decode()


def test_threads_allocate_and_free_on_several_streams_and_the_stats_add_up():
    device = 1
    sizes = [1, 512, 4096, 100_000, 3 * MIB]
    live: list[tuple[int, int, int]] = []
    lock = threading.Lock()

    def work(stream: int) -> None:
        mine = []
        for round_ in range(50):
            size = sizes[(stream + round_) % len(sizes)]
            ptr = LIB.gpumem_torch_alloc(size, device, stream)
            assert ptr
            mine.append((ptr, size, stream))
            if round_ % 2:
                p, s, st = mine.pop(0)
                LIB.gpumem_torch_free(p, s, device, st)
        with lock:
            live.extend(mine)

    threads = [threading.Thread(target=work, args=(stream,)) for stream in (0, 0x10, 0x20, 0x30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({p for p, _, _ in live}) == len(live), "an address was handed out twice"
    s = stats(device)
    assert s == _gpumem.memory_stats(device), "the C and Python views are one pool"
    assert s["allocation.all.current"] == len(live)
    assert s["requested_bytes.all.current"] == sum(size for _, size, _ in live)
    assert s["allocated_bytes.all.current"] >= s["requested_bytes.all.current"]
    assert s["reserved_bytes.all.current"] >= s["allocated_bytes.all.current"]
    for ptr, size, stream in live:
        LIB.gpumem_torch_free(ptr, size, device, stream)
    after = stats(device)
    assert after["allocation.all.current"] == 0
    assert after["allocated_bytes.all.current"] == 0
    released = ctypes.c_uint64()
    assert LIB.gpumem_empty_cache(device, ctypes.byref(released)) == OK
    assert released.value == s["reserved_bytes.all.current"]
    assert stats(device)["reserved_bytes.all.current"] == 0


def test_zero_bytes_is_null_and_a_null_free_does_nothing():
    assert LIB.gpumem_torch_alloc(0, 0, None) is None
    LIB.gpumem_torch_free(None, 0, 0, None)
    assert LIB.gpumem_cupy_malloc(None, 0, 0) is None
    LIB.gpumem_cupy_free(None, None, 0)
    assert stats(0)["allocation.all.current"] == 0


def test_misuse_is_an_error_code_with_a_message_and_frees_nothing():
    device = 2
    ptr = LIB.gpumem_cupy_malloc(None, 1000, device)
    assert ptr
    before = stats(device)
    assert LIB.gpumem_free(ptr, 999, device) == SIZE_MISMATCH
    assert "allocated with 1000 bytes but freed with 999" in last_error()
    assert LIB.gpumem_free(ptr, 1000, 3) == UNKNOWN
    assert f"belongs to device {device}" in last_error()
    assert LIB.gpumem_free(ptr + 8, 1000, device) == UNKNOWN
    assert "not a live allocation" in last_error()
    assert LIB.gpumem_free(ptr, 1000, -1) == INVALID
    assert "device -1 is not valid" in last_error()
    assert stats(device) == before, "a refused free changed the pool"
    # PyTorch's free cannot fail back: it reports and frees nothing.
    LIB.gpumem_torch_free(ptr, 1000, device, 0x55)
    assert "allocated for stream 0 but freed on stream 85" in last_error()
    assert stats(device) == before, "a free on the wrong stream changed the pool"
    LIB.gpumem_torch_free(ptr, 7, device, None)
    assert "freed with 7 bytes" in last_error()
    assert stats(device)["allocation.all.current"] == 1
    assert LIB.gpumem_free(ptr, 1000, device) == OK
    assert LIB.gpumem_free(ptr, 1000, device) == UNKNOWN, "double free"
    assert stats(device)["allocation.all.current"] == 0
    with pytest.raises(gpumem.GpumemError, match="not a live allocation"):
        _gpumem.free(ptr, None, device)


def test_a_hard_limit_set_at_run_time_turns_a_large_request_into_an_explained_oom():
    device = 4
    assert LIB.gpumem_set_limits(device, None, b"64MiB") == OK
    assert LIB.gpumem_cupy_malloc(None, 256 * MIB, device) is None
    assert "out of memory" in last_error()
    oom = text(LIB.gpumem_last_oom, device)
    assert "64.00 MiB" in oom and "GPUMEM_HARD_LIMIT" in oom
    assert stats(device)["num_ooms"] == 1
    with pytest.raises(gpumem.OutOfMemoryError, match="out of memory"):
        _gpumem.alloc(256 * MIB, device)
    assert LIB.gpumem_set_limits(device, None, b"lots") == INVALID
    assert "hard limit" in last_error() and "accepted" in last_error()
    assert LIB.gpumem_set_limits(device, b"128MiB", b"64MiB") == CONFIG
    assert "above the hard limit" in last_error()
    assert LIB.gpumem_set_limits(device, None, b"none") == OK
    ptr = LIB.gpumem_cupy_malloc(None, 256 * MIB, device)
    assert ptr
    assert "hard = none" in gt.memory_summary(device)
    LIB.gpumem_cupy_free(None, ptr, device)


def test_a_snapshot_with_history_opens_with_pickle(tmp_path):
    device = 5
    assert LIB.gpumem_set_history(device, 1000) == OK
    a = LIB.gpumem_torch_alloc(3 * MIB, device, 0x77)
    b = LIB.gpumem_torch_alloc(1000, device, 0x77)
    LIB.gpumem_torch_free(b, 1000, device, 0x77)
    path = tmp_path / "pool.pickle"
    assert LIB.gpumem_snapshot(device, str(path).encode()) == OK
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    assert {"segments", "device_traces"} <= set(snapshot)
    actions = [entry["action"] for entry in snapshot["device_traces"][0]]
    assert actions.count("alloc") == 2 and "free_completed" in actions
    blocks = [b for seg in snapshot["segments"] for b in seg["blocks"]]
    assert any(b["state"] == "active_allocated" and b["requested_size"] == 3 * MIB for b in blocks)
    assert LIB.gpumem_snapshot(device, str(tmp_path / "missing" / "x.pickle").encode()) == 7
    assert "cannot write the snapshot" in last_error()
    LIB.gpumem_torch_free(a, 3 * MIB, device, 0x77)


def test_a_bad_backend_name_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("GPUMEM_DEVICE", "tpu")
    assert LIB.gpumem_cupy_malloc(None, 100, 9) is None
    assert last_error() == (
        'GPUMEM_DEVICE="tpu" is not valid: unknown backend; accepted: cuda (the default), sim'
    )


def test_a_simulated_device_past_a_petabyte_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("GPUMEM_SIM_CAPACITY", str(2**64 - 1))
    assert LIB.gpumem_cupy_malloc(None, 100, 10) is None
    assert "the largest simulated device" in last_error()
    assert 'GPUMEM_SIM_CAPACITY="18446744073709551615" is not valid' in last_error()


def test_the_policy_changes_only_while_nothing_is_allocated():
    device = 6
    ptr = _gpumem.alloc(4096, device)
    with pytest.raises(gpumem.GpumemError, match="while 1 allocations are live"):
        _gpumem.configure("torch")
    _gpumem.free(ptr, 4096, device)
    with pytest.raises(gpumem.GpumemError, match="unknown pool policy"):
        _gpumem.configure("fastest")
    _gpumem.configure("torch")
    try:
        assert gt.policy(device) == "torch"
        assert _gpumem.policy(11) == "torch", "pools made later get it too"
    finally:
        _gpumem.configure("gpumem")
    assert gt.policy(device) == "gpumem"


def test_changing_one_limit_keeps_the_other():
    device = 12
    assert LIB.gpumem_set_limits(device, b"32MiB", None) == OK
    assert LIB.gpumem_set_limits(device, None, b"1GiB") == OK
    assert "soft = 32.00 MiB, hard = 1024.00 MiB" in gt.memory_summary(device)
    assert LIB.gpumem_set_limits(device, b"none", b"none") == OK
    assert "soft = none, hard = none" in gt.memory_summary(device)
