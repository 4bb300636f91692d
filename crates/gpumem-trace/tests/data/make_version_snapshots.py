#!/usr/bin/env python3
"""Writes snapshots shaped as each PyTorch version's producer writes them (no torch needed).

The same small allocation history as make_fixtures.py, in the layouts of (from PyTorch's
sources: torch/csrc/cuda/Module.cpp `_cuda_memorySnapshot`, torch/csrc/cuda/memory_snapshot.cpp
`_memory_snapshot_pickled`, torch/cuda/memory.py):
- torch1.13_segments.pickle: 1.13's `memory_snapshot()`, a list of segments whose blocks
  carry `history` ({addr, real_size, frames}) and no address or requested size; no trace.
- torch2.0_python.pickle: 2.0's `_snapshot()` through Python's pickler (protocol 4):
  `device_traces` entries of action/addr/size/stream with `frames` and `cpp_frames` first,
  no `time_us`; blocks with `history`; no allocator settings.
- torch2.0_cpp.pickle: 2.0's C++ `_memory_snapshot_pickled()` (TorchScript's pickler,
  protocol 2): no batching (one APPENDS per list), strings memoised with BINPUT, the shared
  empty `frames` list referenced with BINGET, entries without frames.
- torch2.1_python.pickle: blocks with address, requested_size and frames; segments with
  requested_size, segment_pool_id and is_expandable; entries with time_us; segment_map.
- torch2.15_python.pickle: entries with compile_context, user_metadata, internal_metadata and
  a pool_id tuple, an `annotate` action; allocator_settings; device_traces before segments.
Run from this directory: python3 make_version_snapshots.py
"""
import pickle
import struct

A, B, C, D, E = (0x7F0000000000, 0x7F0000200000, 0x7F0000200200,
                 0x7F0000200000, 0x7F0002000000)
S7 = 0x55D0C0DE0000
FRAMES = [{"filename": "train.py", "line": 42, "name": "forward"},
          {"filename": "torch/nn/modules/linear.py", "line": 125, "name": "forward"}]
CPP_FRAMES = ["c10::cuda::CUDACachingAllocator::malloc", "at::empty"]

# (action, addr, size, stream); A's alloc happened before recording.
TRACE = [
    ("segment_alloc", B, 2 << 20, 0),
    ("alloc", B, 512, 0),
    ("alloc", C, 1000, 0),
    ("free_requested", B, 512, 0),
    ("free_completed", B, 512, 0),
    ("oom", 123 << 20, 1 << 40, 0),
    ("free_requested", A, 1024, 0),
    ("free_completed", A, 1024, 0),
    ("alloc", D, 256, S7),
    ("snapshot", 0, 21 << 20, 0),
    ("free_completed", C, 1000, 0),
    ("alloc", E, 20 << 20, 0),
]


def entry_2_0(action, addr, size, stream):
    e = {"frames": FRAMES, "cpp_frames": CPP_FRAMES, "action": action}
    e["device_free" if action == "oom" else "addr"] = addr
    e["size"] = size
    e["stream"] = stream
    return e


def entry_2_1(action, addr, size, stream, t):
    e = {"action": action}
    e["device_free" if action == "oom" else "addr"] = addr
    e.update(size=size, stream=stream, time_us=1732233600000000 + t, frames=FRAMES)
    return e


def entry_2_15(action, addr, size, stream, t):
    e = entry_2_1(action, addr, size, stream, t)
    # A new tuple per entry, as pybind11 makes one for each.
    e.update(compile_context="N/A", user_metadata="", pool_id=tuple([0, 0]))
    if action == "alloc" and addr == C:
        e["internal_metadata"] = "mallocWithAddress"
    return e


# The segments at snapshot time: B's segment holds D (live) and the cached rest; E's holds E.
def segments_legacy():
    return [
        {"device": 0, "address": B, "total_size": 2 << 20, "allocated_size": 512,
         "active_size": 512, "stream": S7, "segment_type": "small",
         "blocks": [
             {"size": 512, "state": "active_allocated",
              "history": [{"addr": D, "real_size": 256, "frames": FRAMES}]},
             {"size": (2 << 20) - 512, "state": "inactive"},
         ]},
        {"device": 0, "address": E, "total_size": 20 << 20, "allocated_size": 20 << 20,
         "active_size": 20 << 20, "stream": 0, "segment_type": "large",
         "blocks": [{"size": 20 << 20, "state": "active_allocated",
                     "history": [{"addr": E, "real_size": 20 << 20, "frames": FRAMES}]}]},
    ]


def segments_2_1():
    return [
        {"device": 0, "address": B, "total_size": 2 << 20, "allocated_size": 512,
         "active_size": 512, "requested_size": 256, "stream": S7, "segment_type": "small",
         "segment_pool_id": tuple([0, 0]), "is_expandable": False, "frames": FRAMES,
         "blocks": [
             {"address": D, "size": 512, "requested_size": 256,
              "state": "active_allocated", "frames": FRAMES},
             {"address": D + 512, "size": (2 << 20) - 512, "requested_size": 0,
              "state": "inactive", "frames": []},
         ]},
        {"device": 0, "address": E, "total_size": 20 << 20, "allocated_size": 20 << 20,
         "active_size": 20 << 20, "requested_size": 20 << 20, "stream": 0,
         "segment_type": "large", "segment_pool_id": tuple([0, 0]), "is_expandable": True,
         "frames": FRAMES,
         "blocks": [{"address": E, "size": 20 << 20, "requested_size": 20 << 20,
                     "state": "active_allocated", "frames": FRAMES}]},
    ]


def write(name, value, protocol=4):
    with open(name, "wb") as f:
        pickle.dump(value, f, protocol=protocol)


write("torch1.13_segments.pickle", segments_legacy(), protocol=4)
write("torch2.0_python.pickle", {
    "segments": segments_legacy(),
    "device_traces": [[entry_2_0(*t) for t in TRACE], []],
})
trace_2_1 = [entry_2_1(*t, i) for i, t in enumerate(TRACE)]
trace_2_1.insert(11, entry_2_1("segment_map", E, 20 << 20, 0, 11))
write("torch2.1_python.pickle", {"segments": segments_2_1(), "device_traces": [trace_2_1]})
trace_2_15 = [entry_2_15(*t, i) for i, t in enumerate(TRACE)]
trace_2_15.insert(9, entry_2_15("annotate", D, 256, S7, 9))
write("torch2.15_python.pickle", {
    "device_traces": [trace_2_15],
    "segments": segments_2_1(),
    "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                           "expandable_segments": False,
                           "roundup_power2_divisions": {"1": 0}},
})


class TorchScriptPickler:
    """The opcodes TorchScript's pickler (torch/csrc/jit/serialization/pickler.cpp) writes
    for generic dicts, lists and strings: protocol 2, BINPUT after each new string (repeated
    strings by BINGET), EMPTY_DICT/EMPTY_LIST then MARK ... SETITEMS/APPENDS with every item
    at once, shared lists memoised by identity."""

    def __init__(self):
        self.out = bytearray(b"\x80\x02")
        self.memo = {}

    def put(self, key):
        self.memo[key] = len(self.memo)
        i = self.memo[key]
        self.out += b"q" + bytes([i]) if i < 256 else b"r" + struct.pack("<I", i)

    def get(self, i):
        self.out += b"h" + bytes([i]) if i < 256 else b"j" + struct.pack("<I", i)

    def value(self, v):
        if isinstance(v, str):
            if ("s", v) in self.memo:
                return self.get(self.memo[("s", v)])
            data = v.encode()
            self.out += b"X" + struct.pack("<I", len(data)) + data
            self.put(("s", v))
        elif isinstance(v, bool):
            self.out += b"\x88" if v else b"\x89"
        elif isinstance(v, int):
            if 0 <= v < 256:
                self.out += b"K" + bytes([v])
            elif 0 <= v < 65536:
                self.out += b"M" + struct.pack("<H", v)
            elif -2**31 <= v < 2**31:
                self.out += b"J" + struct.pack("<i", v)
            else:
                self.out += b"\x8a\x08" + struct.pack("<q", v)
        elif isinstance(v, list):
            if ("l", id(v)) in self.memo:
                return self.get(self.memo[("l", id(v))])
            self.out += b"]"
            self.out += b"("
            for item in v:
                self.value(item)
            self.out += b"e"
            if v is EMPTY_FRAMES:
                self.put(("l", id(v)))
        elif isinstance(v, dict):
            self.out += b"}("
            for k, item in v.items():
                self.value(k)
                self.value(item)
            self.out += b"u"
        else:
            raise TypeError(v)


EMPTY_FRAMES = []
cpp_segments = segments_legacy()
for segment in cpp_segments:
    for block in segment["blocks"]:
        for h in block.get("history", []):
            h["frames"] = EMPTY_FRAMES
cpp_trace = []
for action, addr, size, stream in TRACE:
    e = {"action": action, ("device_free" if action == "oom" else "addr"): addr,
         "size": size, "stream": stream}
    cpp_trace.append(e)
writer = TorchScriptPickler()
writer.value({"segments": cpp_segments, "device_traces": [cpp_trace, []]})
writer.out += b"."
with open("torch2.0_cpp.pickle", "wb") as f:
    f.write(bytes(writer.out))
# Python reads it back as the same document.
assert pickle.loads(bytes(writer.out))["device_traces"][0] == cpp_trace
