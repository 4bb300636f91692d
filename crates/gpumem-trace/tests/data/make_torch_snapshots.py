#!/usr/bin/env python3
"""Writes memory snapshots produced by PyTorch's own code (needs torch; runs on CPU).

`torch.cuda._memory_viz._profile_to_snapshot` turns a CPU profile into the snapshot that
memory_viz opens (`profile_plot` uses it). It writes segments without `segment_type` and
blocks without `address`, the variation gpumem's reader must accept. Each snapshot is written
with the pickle protocol PyTorch's `_dump_snapshot` uses (the default) and with protocol 2,
next to a `.expected.json` holding what Python itself reads from it (the block trace's event
count, peak live bytes, and the segments), so that the Rust test compares against numbers this
script, not gpumem, computed.

Run from this directory: python3 make_torch_snapshots.py
"""
import json
import pickle

import torch
from torch.cuda._memory_viz import _profile_to_snapshot


def profiled(steps: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64)
    with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            profile_memory=True, record_shapes=True, with_stack=True) as prof:
        for _ in range(steps):
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return prof


def expected(snapshot: dict) -> dict:
    """What the snapshot says, read here in Python: the first non-empty device trace's
    allocs and completed frees, the peak of live bytes over it (memory allocated before
    recording counts from the start: a free with no alloc, or an active block in segments),
    and the segments."""
    traces = snapshot["device_traces"]
    device = next((i for i, t in enumerate(traces) if t), 0)
    live, seen, events = {}, set(), 0
    before = 0
    for entry in traces[device]:
        if entry["action"] == "alloc":
            live[entry["addr"]] = entry["size"]
            seen.add(entry["addr"])
            events += 1
        elif entry["action"] in ("free_completed", "free"):
            if entry["addr"] not in seen:
                # Allocated before recording: an alloc is implied at the start.
                before += entry["size"]
                seen.add(entry["addr"])
                events += 1
            events += 1
    for seg in snapshot["segments"]:
        if seg.get("device", 0) != device:
            continue
        addr = seg["address"]
        for block in seg["blocks"]:
            start = block.get("address", addr)
            if block["state"] != "inactive" and start not in seen:
                before += block.get("requested_size", block["size"])
                seen.add(start)
                events += 1
            addr = start + block["size"]
    current = peak = before
    live_now = {}
    for entry in traces[device]:
        if entry["action"] == "alloc":
            live_now[entry["addr"]] = entry["size"]
            current += entry["size"]
        elif entry["action"] in ("free_completed", "free"):
            current -= live_now.pop(entry["addr"], entry["size"])
        peak = max(peak, current)
    return {
        "device": device,
        "events": events,
        "peak_live_bytes": peak,
        "segments": [
            {"address": s["address"], "total_size": s["total_size"],
             "blocks": len(s["blocks"]),
             "has_segment_type": "segment_type" in s}
            for s in snapshot["segments"]
        ],
    }


def main() -> None:
    snapshot = _profile_to_snapshot(profiled(steps=2))
    name = f"torch{torch.__version__.split('+')[0]}_profile_to_snapshot"
    for protocol, suffix in ((pickle.DEFAULT_PROTOCOL, ""), (2, "_p2")):
        with open(f"{name}{suffix}.pickle", "wb") as f:
            pickle.dump(snapshot, f, protocol=protocol)
    with open(f"{name}.expected.json", "w") as f:
        json.dump(expected(snapshot), f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
