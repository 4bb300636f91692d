"""A panic inside gpumem reaches Python as an error, never as a crash of the interpreter: the C
entry points, loaded with ctypes from the extension module's own file as PyTorch and CuPy load
them, are provoked with the test-only ``gpumem_test_inject_panic`` (the ``fault-injection``
feature of gpumem-capi; without it these tests are skipped). A panic at a call's start leaves
the pool working; one inside the pool's locked state leaves that device's pool refusing every
later call — through ctypes and through ``gpumem``'s own functions — while the others work.
``gpumem_torch_alloc`` throws a C++ exception, which only a C++ caller (PyTorch) can catch:
python/checks/torch_cpu_panics.py checks it with PyTorch; crates/gpumem-capi/tests/c does in C++.

Devices 50 and up are this file's: the pools it leaves unusable are the process's."""

from __future__ import annotations

import ctypes

import pytest

import gpumem
import gpumem.torch as gt
from gpumem import _gpumem

OK, INTERNAL, UNUSABLE = 0, 9, 10
MIB = 1 << 20
DEVICE = 50  # panics at a call's start: the pool stays usable

vp, sz, i, s = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_char_p


def library() -> ctypes.CDLL:
    lib = ctypes.CDLL(gt.library_path())
    signatures = {
        "gpumem_torch_pool_alloc": (vp, [sz, i, vp]),
        "gpumem_torch_free": (None, [vp, sz, i, vp]),
        "gpumem_cupy_malloc": (vp, [vp, sz, i]),
        "gpumem_cupy_free": (None, [vp, vp, i]),
        "gpumem_alloc": (i, [sz, i, vp, ctypes.POINTER(vp)]),
        "gpumem_free": (i, [vp, sz, i]),
        "gpumem_last_error": (s, []),
        "gpumem_memory_stats": (sz, [i, s, sz]),
        "gpumem_pool_status": (sz, [i, s, sz]),
        "gpumem_last_oom": (sz, [i, s, sz]),
        "gpumem_policy": (sz, [i, s, sz]),
        "gpumem_empty_cache": (i, [i, ctypes.POINTER(ctypes.c_uint64)]),
        "gpumem_reset_peak_stats": (i, [i]),
        "gpumem_set_history": (i, [i, sz]),
        "gpumem_configure": (i, [s, s, s, ctypes.c_int64]),
        "gpumem_set_limits": (i, [i, s, s]),
        "gpumem_snapshot": (i, [i, s]),
        "gpumem_publish": (i, [s]),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype, function.argtypes = restype, argtypes
    return lib


LIB = library()
try:
    INJECT = LIB.gpumem_test_inject_panic
    INJECT.restype, INJECT.argtypes = i, [s, i]
except AttributeError:
    INJECT = None

pytestmark = pytest.mark.skipif(
    INJECT is None,
    reason="the extension was built without gpumem-capi's fault-injection feature "
    "(gpumem-python's feature fault-injection, built by scripts/test-python.sh)",
)


def last_error() -> str:
    return LIB.gpumem_last_error().decode()


def alloc(device: int) -> int | None:
    return LIB.gpumem_cupy_malloc(None, MIB, device)


def works(device: int) -> None:
    ptr = alloc(device)
    assert ptr, last_error()
    assert LIB.gpumem_free(ptr, MIB, device) == OK, last_error()


def buffer_call(function):
    return lambda ptr, device, tmp: function(device, ctypes.create_string_buffer(64), 64)


# Each entry point with valid arguments: (name, call(ptr, device, tmp_path), failure check).
# `ptr` is a live allocation of MIB bytes on `device`.
FAILED_STATUS = ("status", lambda r: r == INTERNAL)
NULL = ("NULL", lambda r: r is None)
ZERO = ("0", lambda r: r == 0)
NOTHING = ("nothing", lambda r: r is None)
CALLS = [
    ("gpumem_torch_pool_alloc", lambda p, d, t: LIB.gpumem_torch_pool_alloc(MIB, d, None), NULL),
    ("gpumem_torch_free", lambda p, d, t: LIB.gpumem_torch_free(p, MIB, d, None), NOTHING),
    ("gpumem_cupy_malloc", lambda p, d, t: LIB.gpumem_cupy_malloc(None, MIB, d), NULL),
    ("gpumem_cupy_free", lambda p, d, t: LIB.gpumem_cupy_free(None, p, d), NOTHING),
    ("gpumem_alloc", lambda p, d, t: LIB.gpumem_alloc(MIB, d, None, ctypes.byref(vp())),
     FAILED_STATUS),
    ("gpumem_free", lambda p, d, t: LIB.gpumem_free(p, MIB, d), FAILED_STATUS),
    ("gpumem_memory_stats", buffer_call(LIB.gpumem_memory_stats), ZERO),
    ("gpumem_pool_status", buffer_call(LIB.gpumem_pool_status), ZERO),
    ("gpumem_last_oom", buffer_call(LIB.gpumem_last_oom), ZERO),
    ("gpumem_policy", buffer_call(LIB.gpumem_policy), ZERO),
    ("gpumem_empty_cache", lambda p, d, t: LIB.gpumem_empty_cache(d, None), FAILED_STATUS),
    ("gpumem_reset_peak_stats", lambda p, d, t: LIB.gpumem_reset_peak_stats(d), FAILED_STATUS),
    ("gpumem_set_history", lambda p, d, t: LIB.gpumem_set_history(d, 100), FAILED_STATUS),
    ("gpumem_configure", lambda p, d, t: LIB.gpumem_configure(None, None, b"2GiB", -1),
     FAILED_STATUS),
    ("gpumem_set_limits", lambda p, d, t: LIB.gpumem_set_limits(d, None, b"2GiB"),
     FAILED_STATUS),
    ("gpumem_snapshot", lambda p, d, t: LIB.gpumem_snapshot(d, str(t / "s.pickle").encode()),
     FAILED_STATUS),
    ("gpumem_publish", lambda p, d, t: LIB.gpumem_publish(str(t / "published").encode()),
     FAILED_STATUS),
    ("gpumem_last_error", lambda p, d, t: LIB.gpumem_last_error(), ("empty", lambda r: r == b"")),
]


@pytest.mark.parametrize("name,call,failure", CALLS, ids=[c[0] for c in CALLS])
def test_a_panic_at_the_start_of_an_entry_point_is_its_error_and_the_pool_works(
        name, call, failure, tmp_path):
    ptr = alloc(DEVICE)
    assert ptr, last_error()
    assert INJECT(name.encode(), 0) == OK, last_error()
    returned = call(ptr, DEVICE, tmp_path)
    what, failed = failure
    assert failed(returned), f"{name} returned {returned!r}, not {what}"
    error = last_error()
    assert error.startswith(
        f"internal error in {name}: panicked: injected panic at the start of {name}; "), error
    assert error.endswith("the pools stay usable"), error
    # The call did nothing: the allocation is still live, nothing was written.
    assert LIB.gpumem_free(ptr, MIB, DEVICE) == OK, last_error()
    assert list(tmp_path.iterdir()) == []
    works(DEVICE)
    assert _gpumem.memory_stats(DEVICE)["allocation.all.current"] == 0


POOL_CHANGING = [call for call in CALLS if call[0] in {
    "gpumem_torch_pool_alloc", "gpumem_torch_free", "gpumem_cupy_malloc", "gpumem_cupy_free",
    "gpumem_alloc", "gpumem_free"}]


@pytest.mark.parametrize("device,name,call,failure",
                         [(51 + n, *c) for n, c in enumerate(POOL_CHANGING)],
                         ids=[c[0] for c in POOL_CHANGING])
def test_a_panic_inside_a_pool_leaves_that_pool_refusing_and_the_others_working(
        device, name, call, failure, tmp_path):
    ptr = alloc(device)
    assert ptr, last_error()
    assert INJECT(name.encode(), 1) == OK, last_error()
    returned = call(ptr, device, tmp_path)
    assert failure[1](returned), f"{name} returned {returned!r}"
    error = last_error()
    assert error.startswith(f"internal error in {name}: panicked: injected panic inside the "
                            f"pool's locked state in {name}; it struck while the pool of "
                            f"device {device} was changing its state"), error
    unusable = (f"the gpumem pool of device {device} is unusable after an internal error in "
                f"{name}: injected panic inside the pool's locked state in {name}; restart "
                "the process")
    assert LIB.gpumem_alloc(MIB, device, None, ctypes.byref(vp())) == UNUSABLE
    assert last_error().startswith(unusable), last_error()
    assert LIB.gpumem_memory_stats(device, None, 0) == 0
    assert last_error().startswith(unusable), last_error()
    # gpumem's Python functions refuse it too, with the same reason.
    with pytest.raises(gpumem.GpumemError) as refused:
        _gpumem.memory_stats(device)
    assert str(refused.value).startswith(unusable)
    works(0)


def test_arming_refuses_what_is_not_an_entry_point():
    assert INJECT(b"gpumem_alocate", 0) == 2
    assert "accepted (while_pool_locked = false): gpumem_torch_alloc, " in last_error()
    assert INJECT(b"gpumem_memory_stats", 1) == 2
    works(DEVICE)
