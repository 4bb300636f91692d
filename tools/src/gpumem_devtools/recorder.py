"""Record every allocation and free of a PyTorch run, with phase boundaries (needs torch).

Two recorders with one interface (`with rec: ...; rec.boundary(label)`):

* `CpuRecorder` uses `torch.profiler.profile(profile_memory=True)`: the CPU
  allocator reports every allocation (pointer, requested bytes) and every free
  of memory allocated while profiling, with profiler timestamps.
* `CudaRecorder` uses `torch.cuda.memory._record_memory_history` and the
  snapshot's `device_traces` (`alloc` / `free_completed`). Boundaries are
  1-element allocations on a private stream, so they sit in the trace itself.

Both leave a `timeline.Recording` in `rec.recording` (see timeline.py, which
matches frees to allocations and needs no PyTorch).
"""

from types import TracebackType
from typing import Any, Protocol

from ._deps import missing
from .timeline import Recording, Timeline, recording_from_cuda_trace

try:
    import torch
    import torch.profiler
except ModuleNotFoundError as _err:
    raise missing("torch", _err) from _err

__all__ = ["CpuRecorder", "CudaRecorder", "Recorder", "Recording", "Timeline",
           "recorder_for", "recording_from_cuda_trace"]

_MARK = "gpumem::"


class Recorder(Protocol):
    source: str
    recording: Recording | None

    def __enter__(self) -> "Recorder": ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...

    def boundary(self, label: str) -> None: ...

    def timeline(self) -> Timeline: ...


class CpuRecorder:
    source = "pytorch-cpu-profiler"

    def __init__(self) -> None:
        self._prof: Any = None
        self.recording: Recording | None = None

    def __enter__(self) -> "CpuRecorder":
        from torch.profiler import ProfilerActivity, profile
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()
        return self

    def boundary(self, label: str) -> None:
        with torch.profiler.record_function(_MARK + label):
            pass

    def timeline(self) -> Timeline:
        """The matched timeline of the finished recording."""
        if self.recording is None:
            raise RuntimeError("nothing recorded (use the recorder as a context manager)")
        return self.recording.timeline()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._prof.__exit__(exc_type, exc, tb)
        if exc_type is not None:
            return
        from torch._C._profiler import _EventType
        raw: list[tuple[int, int, int, int]] = []
        marks: list[tuple[int, str]] = []
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

    def __init__(self, max_entries: int = 2_000_000) -> None:
        self.max_entries = max_entries
        self._stream: Any = None
        self._labels: list[str] = []
        self.recording: Recording | None = None

    def __enter__(self) -> "CudaRecorder":
        torch.cuda.synchronize()
        # No stack traces (context=None): only sizes, addresses and streams are read, and
        # capturing Python stacks from the autograd engine's thread during checkpointed
        # recomputation failed inside PyTorch 2.11's run_backward on an H200 (docs/gpu.md).
        torch.cuda.memory._record_memory_history(max_entries=self.max_entries, context=None)
        self._stream = torch.cuda.Stream()
        return self

    def boundary(self, label: str) -> None:
        with torch.cuda.stream(self._stream):
            marker = torch.empty(1, device="cuda")
        del marker
        self._labels.append(label)

    def timeline(self) -> Timeline:
        """The matched timeline of the finished recording."""
        if self.recording is None:
            raise RuntimeError("nothing recorded (use the recorder as a context manager)")
        return self.recording.timeline()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        if exc_type is not None:
            return
        entries = snap["device_traces"][torch.cuda.current_device()]
        self.recording = recording_from_cuda_trace(entries, self._stream.cuda_stream, self._labels)


def recorder_for(device: str) -> CpuRecorder | CudaRecorder:
    return CudaRecorder() if torch.device(device).type == "cuda" else CpuRecorder()
