"""What the pluggable path does with real PyTorch and no GPU (opt-in: scripts/test-torch-cpu.sh
runs it with a PyTorch environment; CI never downloads PyTorch).

1. gpumem.torch.use() installs the extension module as PyTorch's allocator
   (torch.cuda.get_allocator_backend() == "pluggable"), and a bad setting raises before
   PyTorch is touched;
2. without a driver, PyTorch fails every CUDA allocation before calling gpumem (cudaGetDevice);
3. gpumem's entry point throws PyTorch's own c10::OutOfMemoryError (checked by a C++ program
   compiled against the PyTorch installation's headers and libc10);
4. a gpumem snapshot (simulated device) is read by PyTorch's own memory_viz code.
"""

from __future__ import annotations

import os
import pathlib
import pickle
import subprocess
import sys
import sysconfig
import tempfile

os.environ["GPUMEM_DEVICE"] = "sim"

import torch  # noqa: E402

import gpumem  # noqa: E402
import gpumem.torch as gt  # noqa: E402


def main() -> int:
    print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}")
    try:
        gt.use(hard_limit="lots")
        raise SystemExit("a bad hard limit was accepted")
    except gpumem.GpumemError as error:
        print(f"bad setting refused: {error}")
    gt.use(policy="gpumem", hard_limit="1GiB", history=1000)
    backend = torch.cuda.get_allocator_backend()
    print(f"allocator backend after use(): {backend}")
    assert backend == "pluggable", backend
    try:
        torch.empty(10, device="cuda")
        print("a CUDA tensor was made (a GPU is present)")
    except RuntimeError as error:
        print(f"CUDA tensor without a driver: {type(error).__name__}: {str(error)[:100]}")

    from torch.cuda import _memory_viz

    from gpumem import _gpumem

    _gpumem.set_history(1000, 0)
    ptrs = [_gpumem.alloc(size) for size in (1000, 3 << 20, 25 << 20)]
    _gpumem.free(ptrs[1], 3 << 20)
    with tempfile.TemporaryDirectory() as scratch:
        path = pathlib.Path(scratch) / "gpumem.pickle"
        gt.snapshot(path)
        with open(path, "rb") as f:
            snapshot = pickle.load(f)
    summary = _memory_viz.segsum(snapshot)
    html = _memory_viz.trace_plot(snapshot)
    assert "total_allocated: 25.0MiB" in summary, summary
    print(f"memory_viz reads gpumem's snapshot: segsum says {summary.splitlines()[1]!r}; "
          f"trace_plot {len(html)} bytes of HTML")

    torch_dir = pathlib.Path(torch.__file__).parent
    library = pathlib.Path(gt.library_path())
    with tempfile.TemporaryDirectory() as scratch:
        exe = pathlib.Path(scratch) / "oom_c10"
        subprocess.run(
            ["c++", "-std=c++17", str(pathlib.Path(__file__).with_name("oom_c10.cpp")),
             f"-I{torch_dir / 'include'}", str(library), f"-L{torch_dir / 'lib'}", "-lc10",
             f"-Wl,-rpath,{torch_dir / 'lib'}", f"-Wl,-rpath,{library.parent}",
             # The extension module leaves libpython to its host process; this one links it.
             f"-L{sysconfig.get_config_var('LIBDIR')}", f"-lpython{sysconfig.get_python_version()}",
             f"-Wl,-rpath,{sysconfig.get_config_var('LIBDIR')}", "-o", str(exe)],
            check=True,
        )
        done = subprocess.run([str(exe)], capture_output=True, text=True, check=False,
                              env={**os.environ, "GPUMEM_DEVICE": "sim"})
    print(f"c10::OutOfMemoryError from gpumem_torch_alloc: {done.stdout.strip()}")
    return 0 if done.stdout.strip() == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
