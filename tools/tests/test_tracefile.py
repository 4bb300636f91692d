"""gpumem-trace v1 files: writing, reading, windowing; the committed traces."""

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import TRACES

from gpumem_devtools import tracefile
from gpumem_devtools.timeline import Timeline

COMMITTED = sorted(TRACES.glob("*.jsonl.gz"))

EVENTS: list[dict[str, Any]] = [
    {"op": "alloc", "addr": 0x1000, "size": 4096, "stream": 0},
    {"op": "step", "index": 0},
    {"op": "alloc", "addr": 0x2000, "size": 100, "stream": 0},
    {"op": "free", "addr": 0x2000, "size": 100, "stream": 0},
    {"op": "step", "index": 1},
    {"op": "free", "addr": 0x1000, "size": 4096, "stream": 0},
]


def test_write_then_read_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl.gz"
    meta = {"steps": 2, "grad_ckpt": False, "amp": True, "seq": None, "config": "c.json"}
    tracefile.write(path, "mine", "pytorch-cpu-profiler", meta, EVENTS)
    header, events = tracefile.read(path)
    assert header == {"gpumem_trace": 1, "name": "mine", "source": "pytorch-cpu-profiler",
                      "device_total": None,
                      "meta": {"steps": "2", "grad_ckpt": "false", "amp": "true", "seq": "None",
                               "config": "c.json"}}
    assert events == EVENTS


def test_written_lines_are_the_documented_format(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl.gz"
    tracefile.write(path, "n", "s", {"k": 1}, EVENTS[:2])
    lines = gzip.decompress(path.read_bytes()).decode().split("\n")
    assert lines == [
        '{"gpumem_trace": 1, "name": "n", "source": "s", "device_total": null, '
        '"meta": {"k": "1"}}',
        '{"op":"alloc","addr":4096,"size":4096,"stream":0}',
        '{"op":"step","index":0}',
        "",
    ]


def test_same_events_give_the_same_bytes(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl.gz"
    tracefile.write(path, "n", "s", {}, EVENTS)
    first = path.read_bytes()
    tracefile.write(path, "n", "s", {}, EVENTS)
    assert path.read_bytes() == first


@pytest.mark.parametrize("content", [
    b"",
    b"not gzip at all",
    gzip.compress(b"not json\n"),
    gzip.compress(b'{"gpumem_trace": 2, "name": "x"}\n'),
    gzip.compress(b'[1, 2]\n'),
    gzip.compress(b'{"gpumem_trace": 1}\n{"op": \n'),
])
def test_read_rejects_what_is_not_a_v1_trace(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.jsonl.gz"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="not a gpumem-trace v1 file"):
        tracefile.read(path)


def test_window_starts_at_the_first_step_with_live_memory_as_allocs() -> None:
    tl = Timeline(
        events=[(1, 0xA, 10), (2, 0xB, 20), (3, 0xA, -10),  # before: B stays live
                (11, 0xC, 5), (12, 0xB, -20), (21, 0xD, 7), (22, 0xC, -5),
                (31, 0xD, -7)],  # after the end
        boundaries=[(0, "setup"), (10, "step"), (20, "step"), (30, "end")])
    events, stats = tracefile.window(tl)
    assert events == [
        {"op": "alloc", "addr": 0xB, "size": 20, "stream": 0},
        {"op": "step", "index": 0},
        {"op": "alloc", "addr": 0xC, "size": 5, "stream": 0},
        {"op": "free", "addr": 0xB, "size": 20, "stream": 0},
        {"op": "step", "index": 1},
        {"op": "alloc", "addr": 0xD, "size": 7, "stream": 0},
        {"op": "free", "addr": 0xC, "size": 5, "stream": 0},
    ]
    assert stats == {"initial_live_allocs": 1, "initial_live_bytes": 20, "steps": 2,
                     "events": 7, "peak_live_bytes": 25, "final_live_bytes": 7}


@pytest.fixture(scope="module", params=COMMITTED, ids=[p.name for p in COMMITTED])
def committed(request: pytest.FixtureRequest) -> tuple[Path, dict[str, Any], list[dict[str, Any]]]:
    header, events = tracefile.read(request.param)
    return request.param, header, events


def test_the_committed_traces_are_there() -> None:
    assert len(COMMITTED) == 9


def test_committed_trace_is_consistent_with_its_meta(
        committed: tuple[Path, dict[str, Any], list[dict[str, Any]]]) -> None:
    path, header, events = committed
    assert header["name"] + ".jsonl.gz" == path.name
    assert header["source"] == "pytorch-cpu-profiler"
    meta = header["meta"]
    assert all(isinstance(v, str) for v in meta.values())
    live: dict[int, int] = {}
    current = peak = 0
    steps = 0
    initial = None
    for ev in events:
        if ev["op"] == "step":
            assert ev["index"] == steps
            steps += 1
            if initial is None:
                initial = current
            continue
        assert ev["stream"] == 0
        if ev["op"] == "alloc":
            assert ev["addr"] not in live
            live[ev["addr"]] = ev["size"]
            current += ev["size"]
        else:
            assert ev["op"] == "free"
            assert live.pop(ev["addr"]) == ev["size"]
            current -= ev["size"]
        peak = max(peak, current)
    assert int(meta["events"]) == len(events)
    assert int(meta["steps"]) == steps
    assert int(meta["initial_live_bytes"]) == initial
    assert int(meta["peak_live_bytes"]) == peak
    assert int(meta["final_live_bytes"]) == current
    assert meta["dropped_unmatched_frees"] == "0"


def test_rewriting_a_committed_trace_gives_the_same_lines(
        tmp_path: Path, committed: tuple[Path, dict[str, Any], list[dict[str, Any]]]) -> None:
    path, header, events = committed
    out = tmp_path / path.name
    tracefile.write(out, header["name"], header["source"], header["meta"], events)
    assert gzip.decompress(out.read_bytes()) == gzip.decompress(path.read_bytes())
    first = json.loads(gzip.decompress(path.read_bytes()).split(b"\n", 1)[0])
    assert list(first) == ["gpumem_trace", "name", "source", "device_total", "meta"]
