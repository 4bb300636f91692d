#!/usr/bin/env python3
"""Write a gpumem-trace v1 file as a PyTorch memory snapshot pickle and an RMM CSV log.

The outputs are fixtures for gpumem's PyTorch-snapshot and RMM readers, made
from a trace of a real PyTorch run (tools/capture_trace.py). They have the
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

Usage:
  python3 tools/convert_trace.py testdata/traces/small-gpt2-2l-infer-b1-s32.jsonl.gz \\
      --snapshot OUT.pickle [--protocol 2|3|4] --rmm OUT.csv
"""

import argparse
import pickle
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpumem_torch import tracefile  # noqa: E402

EPOCH_US = 1_795_000_000_000_000  # fixed start time, so outputs are reproducible
STREAM = 0
DEVICE_BASE = 0x7F0000000000


def _round512(size):
    return max(512, (size + 511) // 512 * 512)


def _frames(name):
    return [{"filename": "tools/capture_trace.py", "line": 0, "name": name}]


def _entry(action, addr, size, t):
    return {"action": action, "addr": addr, "size": size, "stream": STREAM,
            "time_us": EPOCH_US + t, "frames": []}


def snapshot(events, trace_name):
    """The `_snapshot()` dict of `events` (see module docstring)."""
    trace, live, device_addr = [], {}, {}
    bump = DEVICE_BASE
    for ev in events:
        op = ev["op"]
        if op == "alloc":
            addr, block = bump, _round512(ev["size"])
            bump += block
            device_addr[ev["addr"]] = addr
            trace.append(_entry("segment_alloc", addr, block, len(trace)))
            trace.append(_entry("alloc", addr, ev["size"], len(trace)))
            live[addr] = ev["size"]
        elif op == "free":
            addr = device_addr.pop(ev["addr"])
            size = live.pop(addr)
            trace.append(_entry("free_requested", addr, size, len(trace)))
            trace.append(_entry("free_completed", addr, size, len(trace)))
            trace.append(_entry("segment_free", addr, _round512(size), len(trace)))
    segments = []
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


def rmm_csv(events, thread=140221):
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path, help="a gpumem-trace v1 .jsonl.gz file")
    ap.add_argument("--snapshot", type=Path, help="write the snapshot pickle here")
    ap.add_argument("--protocol", type=int, default=4, help="pickle protocol (default 4)")
    ap.add_argument("--rmm", type=Path, help="write the RMM CSV here")
    args = ap.parse_args()
    header, events = tracefile.read(args.trace)
    if args.snapshot:
        with open(args.snapshot, "wb") as f:
            pickle.dump(snapshot(events, header["name"]), f, protocol=args.protocol)
    if args.rmm:
        args.rmm.write_text(rmm_csv(events))


if __name__ == "__main__":
    main()
