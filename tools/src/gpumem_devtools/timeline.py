"""Recorded allocation events matched into a timeline (no PyTorch needed).

`Recording` holds raw (time, addr, signed size) events and the phase boundaries
as a recorder saw them; `Recording.timeline()` matches frees to live allocations
by address (a free of memory allocated before recording started is dropped and
counted) and is what peak measurement and trace export consume.
`recording_from_cuda_trace` turns a CUDA snapshot's `device_traces` into a Recording.
"""

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# (time, address, +size for an allocation | -size for a free)
RawEvent = tuple[int, int, int]
# (time, label)
Boundary = tuple[int, str]


@dataclass
class Timeline:
    """Matched events: (time, addr, +size | -size), plus the boundaries."""
    events: list[RawEvent]
    boundaries: list[Boundary]  # in order
    unmatched_frees: int = 0
    duplicate_allocs: int = 0
    size_mismatches: int = 0

    def live_at_each_event(self) -> Iterator[tuple[int, int, int]]:
        """Yields (time, live bytes after the event, event index)."""
        live = 0
        for i, (t, _, size) in enumerate(self.events):
            live += size
            yield t, live, i

    def live_before(self, t: int) -> int:
        """Live bytes just before time `t`."""
        live = 0
        for et, size_live, _ in self.live_at_each_event():
            if et >= t:
                break
            live = size_live
        return live

    def boundary_times(self, label: str) -> list[int]:
        return [t for t, lab in self.boundaries if lab == label]

    def phase_at(self, t: int) -> str | None:
        """Label of the last boundary at or before time `t`."""
        phase = None
        for bt, lab in self.boundaries:
            if bt > t:
                break
            phase = lab
        return phase

    def peak_between(self, start: int, end: int) -> tuple[int, int]:
        """(peak live bytes, time of the peak) over [start, end)."""
        live = 0
        peak: int | None = None
        peak_t = start
        for t, size_live, _ in self.live_at_each_event():
            if t < start:
                live = size_live
                continue
            if peak is None:
                peak, peak_t = live, start
            if t >= end:
                break
            if size_live > peak:
                peak, peak_t = size_live, t
        if peak is None:
            peak = live
        return peak, peak_t


@dataclass
class Recording:
    raw: list[RawEvent]  # sorted by time
    boundaries: list[Boundary] = field(default_factory=list)

    def timeline(self) -> Timeline:
        live: dict[int, int] = {}
        out: list[RawEvent] = []
        unmatched = dup = mismatch = 0
        for t, addr, size in self.raw:
            if size > 0:
                if addr in live:
                    # The free of the previous block at this address was not
                    # seen: retire it so live bytes stay right.
                    dup += 1
                    out.append((t, addr, -live[addr]))
                live[addr] = size
                out.append((t, addr, size))
            else:
                if addr not in live:
                    unmatched += 1
                    continue
                alloc_size = live.pop(addr)
                if alloc_size != -size:
                    mismatch += 1
                out.append((t, addr, -alloc_size))
        return Timeline(out, self.boundaries, unmatched, dup, mismatch)


def recording_from_cuda_trace(entries: Sequence[Mapping[str, Any]], marker_stream: int,
                              labels: Sequence[str]) -> Recording:
    """Recording of a snapshot's `device_traces[d]`: `alloc` / `free_completed`
    entries become events (time = entry index); the `alloc`s on `marker_stream`
    are the boundaries, labelled by `labels` in order."""
    raw: list[RawEvent] = []
    bounds: list[int] = []
    for i, e in enumerate(entries):
        if e["stream"] == marker_stream:
            if e["action"] == "alloc":
                bounds.append(i)
        elif e["action"] == "alloc":
            raw.append((i, e["addr"], e["size"]))
        elif e["action"] == "free_completed":
            raw.append((i, e["addr"], -e["size"]))
    if len(bounds) != len(labels):
        raise RuntimeError(f"{len(bounds)} boundaries in the trace, {len(labels)} recorded: "
                           "the history ring buffer overflowed (raise max_entries)")
    return Recording(raw, list(zip(bounds, labels)))
