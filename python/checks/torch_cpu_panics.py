"""A panic inside gpumem's PyTorch entry point reaches PyTorch as its allocator's other errors do
(opt-in: scripts/test-torch-cpu.sh runs it with a PyTorch environment and the C library built
with the test-only fault-injection feature; CI never downloads PyTorch).

PyTorch's pluggable allocator hears of a failed allocation only through a C++ exception, which
its Python bindings turn into a Python exception: without a GPU, PyTorch fails every CUDA
allocation before it calls gpumem, so the check is a C++ program compiled against the PyTorch
installation's headers and libc10 (panic_c10.cpp): the panic is a std::exception that is not a
c10::Error — RuntimeError in Python, with gpumem's message naming the entry point and the panic —
the entry point works after it, and an OOM is still c10::OutOfMemoryError.

Usage: torch_cpu_panics.py PATH/libgpumem_capi.so (built with --features fault-injection).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tempfile

import torch


def main(library: pathlib.Path) -> int:
    torch_dir = pathlib.Path(torch.__file__).parent
    with tempfile.TemporaryDirectory() as scratch:
        exe = pathlib.Path(scratch) / "panic_c10"
        subprocess.run(
            ["c++", "-std=c++17", str(pathlib.Path(__file__).with_name("panic_c10.cpp")),
             f"-I{torch_dir / 'include'}", str(library), f"-L{torch_dir / 'lib'}", "-lc10",
             f"-Wl,-rpath,{torch_dir / 'lib'}", f"-Wl,-rpath,{library.parent}",
             "-o", str(exe)],
            check=True,
        )
        done = subprocess.run([str(exe)], capture_output=True, text=True, check=False,
                              env={**os.environ, "GPUMEM_DEVICE": "sim",
                                   "LD_LIBRARY_PATH": str(library.parent)})
    print(f"a panic in gpumem_torch_alloc as PyTorch sees it: {done.stdout.strip()}")
    if done.returncode != 0 or done.stdout.strip() != "ok":
        print(done.stderr, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    sys.exit(main(pathlib.Path(sys.argv[1]).resolve()))
