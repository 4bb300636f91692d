"""gpumem-trace v1: JSON lines, gzip-compressed.

Line 1: {"gpumem_trace": 1, "name", "source", "device_total": null, "meta": {str: str}}
Then events: {"op": "alloc"|"free", "addr", "size", "stream": 0} and
{"op": "step", "index": N} at the start of each step. A free's size is the
size of the alloc it frees; memory live when the window opens is emitted as
allocs first, so live bytes are right from the first line.

The format is read by crates/gpumem-trace/src/formats/native.rs; see tools/README.md.
"""

import gzip
import io
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .timeline import Timeline

Event = dict[str, Any]
Header = dict[str, Any]


def window(timeline: Timeline, start_label: str = "step",
           end_label: str = "end") -> tuple[list[Event], dict[str, int]]:
    """Trace events of `timeline` from its first `start_label` boundary to `end_label`.

    Returns (events, stats); every `start_label` boundary becomes a step op.
    """
    start = timeline.boundary_times(start_label)[0]
    end = timeline.boundary_times(end_label)[-1]
    step_times = [t for t in timeline.boundary_times(start_label) if t < end]
    live: dict[int, int] = {}
    for t, addr, size in timeline.events:
        if t >= start:
            break
        if size > 0:
            live[addr] = size
        else:
            del live[addr]
    out: list[Event] = [{"op": "alloc", "addr": a, "size": s, "stream": 0}
                        for a, s in live.items()]
    current = peak = sum(live.values())
    stats = {"initial_live_allocs": len(live), "initial_live_bytes": current}
    k = 0
    for t, addr, size in timeline.events:
        if t < start:
            continue
        if t >= end:
            break
        while k < len(step_times) and step_times[k] <= t:
            out.append({"op": "step", "index": k})
            k += 1
        op = "alloc" if size > 0 else "free"
        out.append({"op": op, "addr": addr, "size": abs(size), "stream": 0})
        current += size
        peak = max(peak, current)
    stats.update(steps=k, events=len(out), peak_live_bytes=peak, final_live_bytes=current)
    return out, stats


def write(path: str | Path, name: str, source: str, meta: Mapping[str, Any],
          events: Iterable[Event]) -> None:
    """Write a gpumem-trace v1 file; `meta` values become strings (bools as true/false)."""
    header = {"gpumem_trace": 1, "name": name, "source": source, "device_total": None,
              "meta": {k: _text(v) for k, v in meta.items()}}
    # mtime=0: the same events give the same bytes.
    with open(path, "wb") as raw, \
            gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as gz, \
            io.TextIOWrapper(gz, encoding="utf-8") as f:
        f.write(json.dumps(header) + "\n")
        for ev in events:
            f.write(json.dumps(ev, separators=(",", ":")) + "\n")


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def read(path: str | Path) -> tuple[Header, list[Event]]:
    """(header, events) of a gpumem-trace v1 file; ValueError if it is not one."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            header = json.loads(f.readline())
            if not isinstance(header, dict) or header.get("gpumem_trace") != 1:
                raise ValueError(f"{path}: not a gpumem-trace v1 file")
            return header, [json.loads(line) for line in f]
    except (gzip.BadGzipFile, EOFError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a gpumem-trace v1 file ({err})") from err
