"""Publishing a C-ABI process's pools, and the training-loop loggers (gpumem.watch, gpumem.hf)
against stand-in torch, transformers and SummaryWriter objects."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
import types

import pytest

import gpumem.torch as gt
from gpumem import _gpumem
from gpumem._gpumem import GpumemError
from gpumem.watch import StepLogger, diagnose

MIB = 1 << 20
GIB = 1 << 30

# A process that uses gpumem only through the C ABI (as PyTorch does), allocates 3 MiB on
# device 0 and waits; it prints the status of its first gpumem_alloc and the last error.
CHILD = textwrap.dedent("""
    import ctypes, sys
    lib = ctypes.CDLL(sys.argv[1])
    lib.gpumem_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
                                 ctypes.POINTER(ctypes.c_void_p)]
    lib.gpumem_last_error.restype = ctypes.c_char_p
    ptr = ctypes.c_void_p()
    status = lib.gpumem_alloc(3 << 20, 0, None, ctypes.byref(ptr))
    print(status, lib.gpumem_last_error().decode(), flush=True)
    sys.stdin.readline()
""")


def start_child(tmp_path, publish: str) -> subprocess.Popen[str]:
    env = dict(os.environ, GPUMEM_PUBLISH=publish, GPUMEM_PUBLISH_DIR=str(tmp_path))
    return subprocess.Popen([sys.executable, "-c", CHILD, gt.library_path()], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def ask(path: str) -> dict:
    with socket.socket(socket.AF_UNIX) as client:
        client.settimeout(5)
        client.connect(path)
        return json.loads(client.makefile().readline())


def test_a_c_abi_process_publishes_its_real_figures(tmp_path):
    child = start_child(tmp_path, "1")
    try:
        assert child.stdout.readline().split()[0] == "0"
        report = ask(str(tmp_path / f"{child.pid}.sock"))
        assert report["pid"] == child.pid
        [pool] = report["pools"]
        assert (pool["device"], pool["allocated"], pool["policy"]) == (0, 3 * MIB, "expandable")
        assert pool["reserved"] >= pool["allocated"]
        # The watching side finds it by itself, as `gpumem diagnose --pid` would.
        listed = [name for name in os.listdir(tmp_path) if name.endswith(".sock")]
        assert listed == [f"{child.pid}.sock"]
    finally:
        child.communicate("\n", timeout=10)


def test_a_bad_publish_value_is_the_c_calls_error(tmp_path):
    child = start_child(tmp_path, "maybe")
    out, _ = child.communicate("\n", timeout=10)
    status, message = out.split(" ", 1)
    assert status == "5"  # GpumemConfig
    assert 'GPUMEM_PUBLISH="maybe" is not accepted' in message
    assert os.listdir(tmp_path) == []


def test_publish_from_python_returns_the_socket(tmp_path):
    path = gt.publish(tmp_path)
    assert path == str(tmp_path / f"{os.getpid()}.sock")
    assert ask(path)["pid"] == os.getpid()
    assert gt.publish(tmp_path / "elsewhere") == path, "publishing twice keeps the first"


class Writer:
    """A stand-in SummaryWriter."""

    def __init__(self) -> None:
        self.scalars: list[tuple[str, float, int]] = []
        self.flushed = False

    def add_scalar(self, tag: str, value: float, step: int | None = None) -> None:
        self.scalars.append((tag, value, step))

    def flush(self) -> None:
        self.flushed = True


def fake_torch(monkeypatch, stats: dict[str, int]) -> None:
    cuda = types.SimpleNamespace(memory_stats=lambda device: dict(stats),
                                 is_initialized=lambda: True, current_device=lambda: 0)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))


def test_gpumem_figures_go_to_the_logger_writer_and_log_fn(caplog):
    ptr = _gpumem.alloc(5 * MIB, 2)
    writer, logged = Writer(), []
    try:
        with StepLogger(writer=writer, log_fn=lambda f, s: logged.append((f, s)), device=2,
                        source="gpumem", every=2) as memory:
            with caplog.at_level(logging.INFO, logger="gpumem"):
                first = memory.step()
                assert memory.step() is None, "every=2 skips the second step"
                third = memory.step()
    finally:
        _gpumem.free(ptr, device=2)
    stats = _gpumem.memory_stats(2)
    assert first.allocated == third.allocated == 5 * MIB
    assert third.reserved == stats["reserved_bytes.all.current"]
    assert (first.step, third.step, third.source) == (1, 3, "gpumem")
    assert ("gpumem/allocated_bytes", 5 * MIB, 3) in writer.scalars
    assert {tag for tag, _, _ in writer.scalars} == {
        "gpumem/allocated_bytes", "gpumem/reserved_bytes", "gpumem/fragmentation"}
    assert logged[1] == ({"gpumem/allocated_bytes": 5 * MIB,
                          "gpumem/reserved_bytes": float(third.reserved),
                          "gpumem/fragmentation": third.fragmentation}, 3)
    assert writer.flushed
    assert "step 3: gpumem (gpumem, device 2): allocated 5.00 MiB" in caplog.text


def test_torch_figures_and_the_fragmentation_finding_printed_once(monkeypatch, caplog):
    # 1 GiB allocated in 4 GiB reserved, 2 GiB of the cache in pieces of split segments.
    fake_torch(monkeypatch, {"allocated_bytes.all.current": GIB,
                             "reserved_bytes.all.current": 4 * GIB,
                             "inactive_split_bytes.all.current": 2 * GIB})
    memory = StepLogger()
    with caplog.at_level(logging.INFO, logger="gpumem"):
        for _ in range(4):
            memory.step()
        assert "gpumem diagnose" not in caplog.text, "too few steps to judge"
        for _ in range(6):
            memory.step()
    assert memory.last.source == "torch"
    assert memory.last.fragmentation == pytest.approx(2 / 3)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, "printed once, when it first holds"
    assert "at step 5" in warnings[0].getMessage()
    assert "fragmentation" in warnings[0].getMessage()


def test_no_finding_when_the_cache_is_small(monkeypatch, caplog):
    fake_torch(monkeypatch, {"allocated_bytes.all.current": 10 * GIB,
                             "reserved_bytes.all.current": 11 * GIB})
    memory = StepLogger()
    with caplog.at_level(logging.WARNING, logger="gpumem"):
        for _ in range(20):
            memory.step()
    assert caplog.records == []
    assert memory.last.fragmentation == 0.0


def test_diagnose_uses_the_rust_rules_and_refuses_bad_samples():
    pool = {"pid": 7, "device": 0, "allocated": GIB, "reserved": 3 * GIB}
    samples = [{"time_ms": t, "gpus": [], "pools": [pool]} for t in range(5)]
    [finding] = diagnose(samples, 7)
    assert (finding.kind, finding.subject) == ("fragmentation", "pid 7 on GPU 0")
    assert finding.advice and finding.evidence
    assert diagnose(samples, 8) == []
    with pytest.raises(GpumemError, match="time_ms"):
        diagnose([{"pools": []}])


def test_bad_arguments_are_refused():
    with pytest.raises(GpumemError, match="accepted: 'auto', 'gpumem', 'torch'"):
        StepLogger(source="cuda")  # type: ignore[arg-type]
    with pytest.raises(GpumemError, match="at least 1"):
        StepLogger(every=0)


def test_the_trainer_callback_logs_at_each_step_end(monkeypatch):
    class TrainerCallback:
        """A stand-in transformers.TrainerCallback."""

    monkeypatch.setitem(sys.modules, "transformers",
                        types.SimpleNamespace(TrainerCallback=TrainerCallback))
    monkeypatch.delitem(sys.modules, "gpumem.hf", raising=False)
    fake_torch(monkeypatch, {"allocated_bytes.all.current": 3 * MIB,
                             "reserved_bytes.all.current": 4 * MIB})
    from gpumem.hf import GpumemCallback

    writer = Writer()
    callback = GpumemCallback(writer=writer)
    assert isinstance(callback, TrainerCallback)
    control = object()
    state = types.SimpleNamespace(global_step=42)
    assert callback.on_step_end(None, state, control) is control
    assert callback.last.step == 42 and callback.last.allocated == 3 * MIB
    assert ("gpumem/reserved_bytes", 4 * MIB, 42) in writer.scalars
    callback.on_train_end(None, state, control)
    assert writer.flushed
