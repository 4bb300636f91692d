#!/usr/bin/env python3
"""Writes the small test fixtures of gpumem-trace (no torch needed).

One small allocation history, written independently of the Rust code in three formats:
- snapshot_p{0..5}.pickle: a dict shaped like torch.cuda.memory._snapshot() (segments with
  blocks and frames, tuple segment_pool_id, legacy and current block states, device_traces with
  every action kind, allocator_settings, extra keys), pickled with each protocol;
- small.jsonl: the same block trace in gpumem's native format;
- small_rmm.csv: the same block trace as an RMM log.
Run from this directory: python3 make_fixtures.py
"""
import json
import pickle

A, B, C, D, E = (0x7F0000000000, 0x7F0000200000, 0x7F0000200200,
                 0x7F0000200000, 0x7F0002000000)
S7 = 0x55D0C0DE0000  # a non-default stream
FRAMES = [{"filename": "train.py", "line": 42, "name": "forward"},
          {"filename": "torch/nn/modules/linear.py", "line": 125, "name": "forward",
           "fx_node_op": "call_module"}]


def entry(action, addr, size, stream=0, t=0, **extra):
    e = {"action": action, "addr": addr, "size": size, "stream": stream,
         "time_us": 1732233600000000 + t, "frames": FRAMES}
    e.update(extra)
    return e


# Block trace (what the readers must produce), in order:
# A was allocated before recording began (only its free is in the trace).
EVENTS = [
    ("alloc", A, 1024, 0),  # synthesised by the reader from A's free
    ("alloc", B, 512, 0),
    ("alloc", C, 1000, 0),
    ("free", B, 512, 0),
    ("free", A, 1024, 0),
    ("alloc", D, 256, S7),
    ("free", C, 1000, 0),
    ("alloc", E, 20 << 20, 0),
]

device0 = [
    entry("segment_alloc", B, 2 << 20, t=1),
    entry("alloc", B, 512, t=2),
    entry("alloc", C, 1000, t=3, compile_context="N/A"),
    entry("free_requested", B, 512, t=4),
    entry("free_completed", B, 512, t=5),
    {"action": "oom", "device_free": 123 << 20, "size": 1 << 40, "stream": 0,
     "time_us": 1732233600000006, "frames": []},
    entry("free_requested", A, 1024, t=7),
    entry("free_completed", A, 1024, t=8),
    entry("alloc", D, 256, stream=S7, t=9),
    entry("snapshot", 0, 21 << 20, t=10),
    entry("user_defined", 0, 0, t=11, user_metadata="step 1"),
    entry("free_completed", C, 1000, t=12),
    entry("segment_map", E, 20 << 20, t=13),
    entry("alloc", E, 20 << 20, t=14),
]

segments = [
    {"device": 0, "address": B, "total_size": 2 << 20, "allocated_size": 512,
     "active_size": 512, "requested_size": 256, "stream": S7, "segment_type": "small",
     "segment_pool_id": (0, 0), "is_expandable": False, "frames": FRAMES,
     "blocks": [
         {"address": D, "size": 512, "requested_size": 256, "state": "active_allocated",
          "frames": FRAMES},
         {"address": D + 512, "size": 1024, "requested_size": 1000,
          "state": "active_awaiting_free", "frames": []},
         {"address": D + 1536, "size": (2 << 20) - 1536, "requested_size": 0,
          "state": "inactive", "frames": []},
     ]},
    # Legacy-shaped segment: blocks without address/requested_size, history instead of frames.
    {"device": 0, "address": E, "total_size": 20 << 20, "stream": 0,
     "segment_type": "large", "segment_pool_id": (1, 2), "is_expandable": True,
     "blocks": [
         {"size": 20 << 20, "state": "active_allocated",
          "history": [{"real_size": 20 << 20, "frames": FRAMES}]},
     ]},
]

snapshot = {
    "segments": segments,
    "device_traces": [device0, []],
    "allocator_settings": {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "max_split_size": -1,
        "garbage_collection_threshold": 0.0,
        "expandable_segments": True,
        "pinned_num_register_threads": 1,
        "release_lock_on_cudamalloc": False,
        "pinned_use_cuda_host_register": False,
        "roundup_power2_divisions": {"1": 0, "2": 0, "4": 0},
    },
    "external_annotations": [],
}

for protocol in (0, 1, 2, 3, 4, 5):
    with open(f"snapshot_p{protocol}.pickle", "wb") as f:
        pickle.dump(snapshot, f, protocol=protocol)

with open("small.jsonl", "w") as f:
    f.write(json.dumps({"gpumem_trace": 1, "name": "small", "source": "make_fixtures.py",
                        "device_total": None, "meta": {}}) + "\n")
    for op, addr, size, stream in EVENTS:
        f.write(json.dumps({"op": op, "addr": addr, "size": size, "stream": stream}) + "\n")

with open("small_rmm.csv", "w") as f:
    f.write("Thread,Time,Action,Pointer,Size,Stream\n")
    for i, (op, addr, size, stream) in enumerate(EVENTS):
        action = "allocate" if op == "alloc" else "free"
        f.write(f"7,14:03:22.{i:06d},{action},{addr:#x},{size},{stream:x}\n")
    f.write("7,14:03:23.000000,allocate failure,(nil),1099511627776,0\n")
