#!/usr/bin/env python3
"""Checks a snapshot written by gpumem the way PyTorch's tools would load it.

usage: check_snapshot.py SNAPSHOT.pickle SNAPSHOT.json
Loads the pickle with pickle.load, checks the shape memory_viz relies on (types of every
field, tuple segment_pool_id, empty frames lists, oom entries with device_free), checks that
the JSON holds the same structure, and prints a one-line summary. Exits non-zero on failure.
"""
import json
import pickle
import sys

pickle_path, json_path = sys.argv[1], sys.argv[2]
with open(pickle_path, "rb") as f:
    snap = pickle.load(f)
with open(json_path) as f:
    from_json = json.load(f)

assert isinstance(snap, dict), type(snap)
assert set(snap) == {"segments", "device_traces", "allocator_settings"}, sorted(snap)
ints = ("address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
        "device")
for seg in snap["segments"]:
    for key in ints:
        assert type(seg[key]) is int, (key, seg[key])
    assert seg["segment_type"] in ("small", "large"), seg["segment_type"]
    pool = seg["segment_pool_id"]
    assert type(pool) is tuple and len(pool) == 2 and all(type(x) is int for x in pool), pool
    assert type(seg["is_expandable"]) is bool
    assert seg["frames"] == []
    address = seg["address"]
    for block in seg["blocks"]:
        assert block["address"] == address, "blocks tile the segment in address order"
        address += block["size"]
        assert block["state"] in ("active_allocated", "active_pending_free", "inactive")
        assert block["frames"] == []
        assert type(block["requested_size"]) is int
    assert address == seg["address"] + seg["total_size"], "blocks cover the segment"
actions = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "oom", "snapshot"}
entries = 0
for trace in snap["device_traces"]:
    assert isinstance(trace, list)
    for e in trace:
        entries += 1
        assert e["action"] in actions, e["action"]
        assert "device_free" in e if e["action"] == "oom" else type(e["addr"]) is int, e
        assert type(e["size"]) is int and type(e["stream"]) is int and type(e["time_us"]) is int
        for frame in e["frames"]:
            assert type(frame["filename"]) is str and type(frame["name"]) is str, frame
            assert type(frame["line"]) is int, frame


def lists(value):
    """JSON has no tuples: compare with tuples turned into lists."""
    if isinstance(value, (list, tuple)):
        return [lists(v) for v in value]
    if isinstance(value, dict):
        return {k: lists(v) for k, v in value.items()}
    return value


assert lists(snap) == from_json, "pickle and JSON hold the same structure"
print(f"ok: {len(snap['segments'])} segments, {len(snap['device_traces'])} device traces, "
      f"{entries} entries")
