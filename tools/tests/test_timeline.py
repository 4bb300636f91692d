"""Matching recorded events into a timeline, peaks and phases (no PyTorch)."""

from typing import Any

import pytest

from gpumem_devtools.timeline import Recording, Timeline, recording_from_cuda_trace


def test_frees_match_allocations_by_address() -> None:
    rec = Recording(raw=[(1, 0x10, 100), (2, 0x99, -50),  # free of pre-recording memory
                         (3, 0x20, 30), (4, 0x10, 60),     # 0x10 reused: its free was missed
                         (5, 0x20, -31),                   # size differs from the alloc's
                         (6, 0x10, -60)],
                    boundaries=[(0, "step")])
    tl = rec.timeline()
    assert tl.events == [(1, 0x10, 100), (3, 0x20, 30), (4, 0x10, -100), (4, 0x10, 60),
                         (5, 0x20, -30), (6, 0x10, -60)]
    assert (tl.unmatched_frees, tl.duplicate_allocs, tl.size_mismatches) == (1, 1, 1)
    assert tl.boundaries == [(0, "step")]


def test_peak_live_and_phase() -> None:
    tl = Timeline(events=[(1, 1, 100), (5, 2, 50), (6, 2, -50), (8, 3, 500), (9, 3, -500),
                          (12, 4, 70)],
                  boundaries=[(0, "step"), (4, "forward"), (7, "backward"), (10, "end")])
    assert tl.live_before(5) == 100
    assert tl.live_before(6) == 150
    assert tl.live_before(100) == 170
    assert tl.peak_between(0, 10) == (600, 8)
    assert tl.peak_between(4, 7) == (150, 5)
    assert tl.peak_between(10, 20) == (170, 12)
    assert tl.peak_between(20, 30) == (170, 20)  # nothing after: the live bytes at start
    assert tl.phase_at(8) == "backward"
    assert tl.phase_at(4) == "forward"
    assert Timeline([], [(3, "step")]).phase_at(1) is None
    assert tl.boundary_times("step") == [0]
    assert tl.boundary_times("end") == [10]


def _entry(action: str, addr: int, size: int, stream: int = 0) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": stream,
            "time_us": 0, "frames": []}


def test_cuda_trace_conversion() -> None:
    # The case of measure_peak --self-test's step 6, which needs no GPU.
    marker = 99
    entries = [_entry("free_completed", 0x500, 4096),  # allocated before recording
               _entry("alloc", 0x9000, 512, marker), _entry("free_requested", 0x9000, 512, marker),
               _entry("free_completed", 0x9000, 512, marker),
               _entry("alloc", 0x1000, 1000), _entry("alloc", 0x2000, 3000),
               _entry("free_requested", 0x1000, 1000), _entry("free_completed", 0x1000, 1000),
               _entry("alloc", 0x9000, 512, marker), _entry("alloc", 0x3000, 500)]
    tl = recording_from_cuda_trace(entries, marker, ["step", "end"]).timeline()
    assert tl.boundaries == [(1, "step"), (8, "end")]
    assert tl.events == [(4, 0x1000, 1000), (5, 0x2000, 3000), (7, 0x1000, -1000),
                         (9, 0x3000, 500)]
    assert tl.peak_between(*tl.boundary_times("step"), *tl.boundary_times("end")) == (4000, 5)
    assert tl.unmatched_frees == 1
    assert tl.phase_at(9) == "end"


def test_cuda_trace_with_lost_boundaries_is_an_error() -> None:
    entries = [_entry("alloc", 0x9000, 512, 7)]
    with pytest.raises(RuntimeError, match="ring buffer overflowed"):
        recording_from_cuda_trace(entries, 7, ["step", "end"])
