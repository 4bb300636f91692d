"""convert_trace: the snapshot pickle and RMM CSV written from a trace (no PyTorch)."""

import csv
import pickle
from pathlib import Path

import pytest
from conftest import SMALL

from gpumem_devtools import convert_trace, tracefile

EVENTS = [
    {"op": "alloc", "addr": 0x55, "size": 1000, "stream": 0},
    {"op": "step", "index": 0},
    {"op": "alloc", "addr": 0x66, "size": 2_000_000, "stream": 0},
    {"op": "free", "addr": 0x55, "size": 1000, "stream": 0},
    {"op": "alloc", "addr": 0x77, "size": 1, "stream": 0},
]


def test_snapshot_models_one_segment_per_block() -> None:
    snap = convert_trace.snapshot(EVENTS, "tiny")
    base, epoch = 0x7F0000000000, convert_trace.EPOCH_US
    trace = snap["device_traces"][0]
    assert [(e["action"], e["addr"], e["size"], e["time_us"] - epoch) for e in trace] == [
        ("segment_alloc", base, 1024, 0), ("alloc", base, 1000, 1),
        ("segment_alloc", base + 1024, 2_000_384, 2), ("alloc", base + 1024, 2_000_000, 3),
        ("free_requested", base, 1000, 4), ("free_completed", base, 1000, 5),
        ("segment_free", base, 1024, 6),
        ("segment_alloc", base + 1024 + 2_000_384, 512, 7),
        ("alloc", base + 1024 + 2_000_384, 1, 8),
    ]
    assert all(e["stream"] == 0 and e["frames"] == [] for e in trace)
    segs = snap["segments"]
    assert [(s["address"], s["total_size"], s["requested_size"], s["segment_type"])
            for s in segs] == [(base + 1024, 2_000_384, 2_000_000, "large"),
                               (base + 1024 + 2_000_384, 512, 1, "small")]
    assert segs[0]["blocks"] == [{"address": base + 1024, "size": 2_000_384,
                                  "requested_size": 2_000_000, "state": "active_allocated",
                                  "frames": [{"filename": "tools/capture_trace.py", "line": 0,
                                              "name": "tiny"}]}]
    assert segs[0]["segment_pool_id"] == (0, 0)
    assert snap["allocator_settings"]["expandable_segments"] is False


def test_snapshot_rejects_a_free_of_unallocated_memory() -> None:
    with pytest.raises(ValueError, match="free of 0x99"):
        convert_trace.snapshot([{"op": "free", "addr": 0x99, "size": 8, "stream": 0}], "x")


def test_rmm_csv_rows() -> None:
    assert convert_trace.rmm_csv(EVENTS, thread=7) == (
        "Thread,Time,Action,Pointer,Size,Stream\n"
        "7,14:03:22.000000,allocate,0x55,1000,0\n"
        "7,14:03:22.000001,allocate,0x66,2000000,0\n"
        "7,14:03:22.000002,free,0x55,1000,0\n"
        "7,14:03:22.000003,allocate,0x77,1,0\n")


def test_regenerating_the_committed_fixtures_gives_the_same_bytes(tmp_path: Path) -> None:
    # The exact commands of tools/README.md.
    trace = f"{SMALL}.jsonl.gz"
    p2, p4, rmm = tmp_path / "p2.pickle", tmp_path / "p4.pickle", tmp_path / "rmm.csv"
    assert convert_trace.main([trace, "--snapshot", str(p2), "--protocol", "2"]) == 0
    assert convert_trace.main([trace, "--snapshot", str(p4), "--protocol", "4",
                               "--rmm", str(rmm)]) == 0
    assert p2.read_bytes() == Path(f"{SMALL}.snapshot.p2.pickle").read_bytes()
    assert p4.read_bytes() == Path(f"{SMALL}.snapshot.p4.pickle").read_bytes()
    assert rmm.read_bytes() == Path(f"{SMALL}.rmm.csv").read_bytes()


def test_committed_fixtures_hold_the_trace_events() -> None:
    header, events = tracefile.read(f"{SMALL}.jsonl.gz")
    ops = [(e["op"], e["addr"], e["size"]) for e in events if e["op"] != "step"]
    with open(f"{SMALL}.rmm.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [({"allocate": "alloc", "free": "free"}[r["Action"]], int(r["Pointer"], 16),
             int(r["Size"])) for r in rows] == ops
    for protocol in (2, 4):
        with open(f"{SMALL}.snapshot.p{protocol}.pickle", "rb") as f:
            snap = pickle.load(f)
        allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
        assert [e["size"] for e in allocs] == [s for op, _, s in ops if op == "alloc"]
        live = sum(s["requested_size"] for s in snap["segments"])
        assert live == int(header["meta"]["final_live_bytes"])


def test_every_protocol_loads_back(tmp_path: Path) -> None:
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        out = tmp_path / f"p{protocol}.pickle"
        assert convert_trace.main([f"{SMALL}.jsonl.gz", "--snapshot", str(out),
                                   "--protocol", str(protocol)]) == 0
        with open(out, "rb") as f:
            assert pickle.load(f) == convert_trace.snapshot(
                tracefile.read(f"{SMALL}.jsonl.gz")[1], "small-gpt2-2l-infer-b1-s32")


def test_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = f"{SMALL}.jsonl.gz"
    with pytest.raises(SystemExit) as exit_info:
        convert_trace.main([trace])
    assert exit_info.value.code == 2
    assert "nothing to write: give --snapshot and/or --rmm" in capsys.readouterr().err

    with pytest.raises(SystemExit) as exit_info:
        convert_trace.main([trace, "--snapshot", "x", "--protocol", "9"])
    assert exit_info.value.code == 2
    assert "argument --protocol: invalid choice: 9" in capsys.readouterr().err

    with pytest.raises(SystemExit) as exit_info:
        convert_trace.main([trace, "--rmm", "x", "--protocol", "two"])
    assert exit_info.value.code == 2
    assert "argument --protocol: invalid int value: 'two'" in capsys.readouterr().err

    assert convert_trace.main([str(tmp_path / "absent.jsonl.gz"), "--rmm", "x"]) == 1
    assert capsys.readouterr().err == (
        f"gpumem-convert-trace: error: cannot read {tmp_path / 'absent.jsonl.gz'}: "
        "No such file or directory\n")

    # The RMM CSV is not a trace this tool reads.
    assert convert_trace.main([f"{SMALL}.rmm.csv", "--rmm", str(tmp_path / "o.csv")]) == 1
    assert "rmm.csv: not a gpumem-trace v1 file" in capsys.readouterr().err
    assert not (tmp_path / "o.csv").exists()

    assert convert_trace.main([trace, "--rmm", str(tmp_path / "no" / "dir.csv")]) == 1
    assert capsys.readouterr().err == (
        f"gpumem-convert-trace: error: cannot write {tmp_path / 'no' / 'dir.csv'}: "
        "No such file or directory\n")

    bad = tmp_path / "bad.jsonl.gz"
    tracefile.write(bad, "bad", "s", {}, [{"op": "free", "addr": 16, "size": 8, "stream": 0}])
    assert convert_trace.main([str(bad), "--snapshot", str(tmp_path / "s.pickle")]) == 1
    assert "free of 0x10, which is not allocated" in capsys.readouterr().err
    assert not (tmp_path / "s.pickle").exists()
