"""The Python side of benches/alloc_free.rs: sys.argv[2] alloc+free pairs of 4096 bytes through
ctypes over the library sys.argv[1] (as gpumem.torch's users reach it); prints the ns taken."""

import ctypes
import sys
import time

lib = ctypes.CDLL(sys.argv[1])
n = int(sys.argv[2])
lib.gpumem_torch_alloc.restype = ctypes.c_void_p
lib.gpumem_torch_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
lib.gpumem_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
alloc, free = lib.gpumem_torch_alloc, lib.gpumem_torch_free
free(alloc(4096, 0, None), 4096, 0, None)  # warm the pool
start = time.perf_counter_ns()
for _ in range(n):
    free(alloc(4096, 0, None), 4096, 0, None)
print(time.perf_counter_ns() - start)
