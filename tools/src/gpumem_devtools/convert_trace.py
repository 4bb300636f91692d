"""Write a gpumem-trace v1 file as a PyTorch memory snapshot pickle and an RMM CSV log.

The outputs are fixtures for gpumem's PyTorch-snapshot and RMM readers, made
from a trace of a real PyTorch run (gpumem-capture-trace). They have the
exact structure of `torch.cuda.memory._snapshot()` / `_dump_snapshot` and of
RMM's `logging_resource_adaptor`, but no CUDA allocator produced them:

* snapshot: the allocator is modelled as with caching disabled -- every
  block sits in its own segment of the block size (requested size rounded up
  to 512 B) at a fresh device-like address (bump-allocated from
  0x7f0000000000, so rounded blocks never overlap); `device_traces[0]` holds
  segment_alloc, alloc, free_requested, free_completed, segment_free per
  block; `segments` holds the blocks still live at the end; `time_us` counts
  up 1 us per event from a fixed epoch. Sizes and order are the trace's.
* RMM CSV: `Thread,Time,Action,Pointer,Size,Stream` with allocate / free
  rows, the trace's own addresses and sizes.

Needs no PyTorch. Usage:
  gpumem-convert-trace testdata/traces/small-gpt2-2l-infer-b1-s32.jsonl.gz \\
      --snapshot OUT.pickle [--protocol 2|3|4] --rmm OUT.csv
(or `python -m gpumem_devtools.convert_trace ...`)
"""

import argparse
import pickle
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from . import tracefile
from ._cli import fail

PROG = "gpumem-convert-trace"
EPOCH_US = 1_795_000_000_000_000  # fixed start time, so outputs are reproducible
STREAM = 0
DEVICE_BASE = 0x7F0000000000


def _round512(size: int) -> int:
    return max(512, (size + 511) // 512 * 512)


def _frames(name: str) -> list[dict[str, Any]]:
    # The script's path when the committed fixtures were made; kept so that they
    # regenerate byte for byte.
    return [{"filename": "tools/capture_trace.py", "line": 0, "name": name}]


def _entry(action: str, addr: int, size: int, t: int) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": STREAM,
            "time_us": EPOCH_US + t, "frames": []}


def snapshot(events: Iterable[tracefile.Event], trace_name: str) -> dict[str, Any]:
    """The `_snapshot()` dict of `events` (see module docstring)."""
    trace: list[dict[str, Any]] = []
    live: dict[int, int] = {}
    device_addr: dict[int, int] = {}
    bump = DEVICE_BASE
    for i, ev in enumerate(events):
        op = ev["op"]
        if op == "alloc":
            addr, block = bump, _round512(ev["size"])
            bump += block
            device_addr[ev["addr"]] = addr
            trace.append(_entry("segment_alloc", addr, block, len(trace)))
            trace.append(_entry("alloc", addr, ev["size"], len(trace)))
            live[addr] = ev["size"]
        elif op == "free":
            if ev["addr"] not in device_addr:
                raise ValueError(f"event {i}: free of {ev['addr']:#x}, which is not allocated")
            addr = device_addr.pop(ev["addr"])
            size = live.pop(addr)
            trace.append(_entry("free_requested", addr, size, len(trace)))
            trace.append(_entry("free_completed", addr, size, len(trace)))
            trace.append(_entry("segment_free", addr, _round512(size), len(trace)))
    segments: list[dict[str, Any]] = []
    for addr in sorted(live):
        size, block = live[addr], _round512(live[addr])
        segments.append({
            "device": 0, "address": addr, "total_size": block, "allocated_size": block,
            "active_size": block, "requested_size": size, "stream": STREAM,
            "segment_type": "large" if block > 1 << 20 else "small",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": _frames(trace_name),
            "blocks": [{"address": addr, "size": block, "requested_size": size,
                        "state": "active_allocated", "frames": _frames(trace_name)}],
        })
    settings = {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                "garbage_collection_threshold": 0.0, "expandable_segments": False,
                "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
                "pinned_use_cuda_host_register": False, "roundup_power2_divisions": {}}
    return {"segments": segments, "device_traces": [trace], "allocator_settings": settings}


def rmm_csv(events: Iterable[tracefile.Event], thread: int = 140221) -> str:
    """RMM logging_resource_adaptor CSV of `events`, 1 us apart from 14:03:22."""
    rows = ["Thread,Time,Action,Pointer,Size,Stream"]
    t = (14 * 3600 + 3 * 60 + 22) * 1_000_000
    for ev in events:
        if ev["op"] not in ("alloc", "free"):
            continue
        secs, us = divmod(t, 1_000_000)
        stamp = f"{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}.{us:06d}"
        action = "allocate" if ev["op"] == "alloc" else "free"
        rows.append(f"{thread},{stamp},{action},{ev['addr']:#x},{ev['size']},{STREAM}")
        t += 1
    return "\n".join(rows) + "\n"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("trace", type=Path, help="a gpumem-trace v1 .jsonl.gz file")
    ap.add_argument("--snapshot", type=Path, help="write the snapshot pickle here")
    ap.add_argument("--protocol", type=int, default=4,
                    choices=range(pickle.HIGHEST_PROTOCOL + 1), metavar="N",
                    help=f"pickle protocol, 0-{pickle.HIGHEST_PROTOCOL} (default 4)")
    ap.add_argument("--rmm", type=Path, help="write the RMM CSV here")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.snapshot is None and args.rmm is None:
        ap.error("nothing to write: give --snapshot and/or --rmm")
    try:
        header, events = tracefile.read(args.trace)
    except OSError as err:
        return fail(ap.prog, f"cannot read {args.trace}: {err.strerror or err}")
    except ValueError as err:
        return fail(ap.prog, err)
    try:
        if args.snapshot:
            data = snapshot(events, header["name"])
            with open(args.snapshot, "wb") as f:
                pickle.dump(data, f, protocol=args.protocol)
        if args.rmm:
            args.rmm.write_text(rmm_csv(events))
    except OSError as err:
        return fail(ap.prog, f"cannot write {err.filename}: {err.strerror or err}")
    except KeyError as err:
        return fail(ap.prog, f"{args.trace}: an event or the header lacks the key {err}")
    except ValueError as err:
        return fail(ap.prog, f"{args.trace}: {err}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
