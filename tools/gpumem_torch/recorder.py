"""Record every allocation and free of a PyTorch run, with phase boundaries.

Two recorders with one interface (`with rec: ...; rec.boundary(label)`):

* `CpuRecorder` uses `torch.profiler.profile(profile_memory=True)`: the CPU
  allocator reports every allocation (pointer, requested bytes) and every free
  of memory allocated while profiling, with profiler timestamps.
* `CudaRecorder` uses `torch.cuda.memory._record_memory_history` and the
  snapshot's `device_traces` (`alloc` / `free_completed`). Boundaries are
  1-element allocations on a private stream, so they sit in the trace itself.

`Recording.timeline()` matches frees to live allocations by address (a free
of memory allocated before recording started is dropped and counted) and is
what peak measurement and trace export consume.
"""

from dataclasses import dataclass, field

import torch

_MARK = "gpumem::"


@dataclass
class Timeline:
    """Matched events: (time, addr, +size | -size), plus the boundaries."""
    events: list
    boundaries: list  # [(time, label)] in order
    unmatched_frees: int = 0
    duplicate_allocs: int = 0
    size_mismatches: int = 0

    def live_at_each_event(self):
        """Yields (time, live bytes after the event, event index)."""
        live = 0
        for i, (t, _, size) in enumerate(self.events):
            live += size
            yield t, live, i

    def live_before(self, t):
        """Live bytes just before time `t`."""
        live = 0
        for et, size_live, _ in self.live_at_each_event():
            if et >= t:
                break
            live = size_live
        return live

    def boundary_times(self, label):
        return [t for t, lab in self.boundaries if lab == label]

    def phase_at(self, t):
        """Label of the last boundary at or before time `t`."""
        phase = None
        for bt, lab in self.boundaries:
            if bt > t:
                break
            phase = lab
        return phase

    def peak_between(self, start, end):
        """(peak live bytes, time of the peak) over [start, end)."""
        live = 0
        peak, peak_t = None, start
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
    raw: list  # [(time, addr, signed size)] sorted by time
    boundaries: list = field(default_factory=list)

    def timeline(self):
        live = {}
        out = []
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


class CpuRecorder:
    source = "pytorch-cpu-profiler"

    def __init__(self):
        self._prof = None
        self.recording = None

    def __enter__(self):
        from torch.profiler import ProfilerActivity, profile
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()
        return self

    def boundary(self, label):
        with torch.profiler.record_function(_MARK + label):
            pass

    def __exit__(self, *exc):
        self._prof.__exit__(*exc)
        if exc[0] is not None:
            return
        from torch._C._profiler import _EventType
        raw, marks = [], []
        stack = list(self._prof.profiler.kineto_results.experimental_event_tree())
        while stack:
            ev = stack.pop()
            stack.extend(ev.children)
            if ev.tag == _EventType.Allocation:
                ef = ev.extra_fields
                if ef.device.type == "cpu" and ef.alloc_size != 0:
                    raw.append((ev.start_time_ns, ef.id, ef.ptr, ef.alloc_size))
            elif ev.name.startswith(_MARK):
                marks.append((ev.start_time_ns, ev.name[len(_MARK):]))
        raw.sort()
        marks.sort()
        self.recording = Recording([(t, p, s) for t, _, p, s in raw], marks)
        self._prof = None


class CudaRecorder:
    source = "pytorch-cuda-history"

    def __init__(self, max_entries=2_000_000):
        self.max_entries = max_entries
        self._stream = None
        self._labels = []
        self.recording = None

    def __enter__(self):
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history(max_entries=self.max_entries)
        self._stream = torch.cuda.Stream()
        return self

    def boundary(self, label):
        with torch.cuda.stream(self._stream):
            marker = torch.empty(1, device="cuda")
        del marker
        self._labels.append(label)

    def __exit__(self, *exc):
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        if exc[0] is not None:
            return
        entries = snap["device_traces"][torch.cuda.current_device()]
        self.recording = recording_from_cuda_trace(entries, self._stream.cuda_stream, self._labels)


def recording_from_cuda_trace(entries, marker_stream, labels):
    """Recording of a snapshot's `device_traces[d]`: `alloc` / `free_completed`
    entries become events (time = entry index); the `alloc`s on `marker_stream`
    are the boundaries, labelled by `labels` in order."""
    raw, bounds = [], []
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


def recorder_for(device):
    return CudaRecorder() if torch.device(device).type == "cuda" else CpuRecorder()

