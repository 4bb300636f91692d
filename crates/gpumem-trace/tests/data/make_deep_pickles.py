#!/usr/bin/env python3
"""Writes the deeply nested pickles of gpumem-trace's tests (tests/not_snapshots.rs), as
Python's own pickler writes them, gzipped (they are 600 KB and 1 MB, and compress to ~1 KB):

- deep_list_p5.pickle.gz: x = []; 200000 times x = [x]; pickled with protocol 5;
- deep_dict_p4.pickle.gz: d = {}; 200000 times d = {"a": d}; pickled with protocol 4.

Pickling something that deep recurses in CPython, so it runs in a thread with a large stack.
Run from this directory: python3 make_deep_pickles.py
"""
import gzip
import pickle
import sys
import threading

DEPTH = 200_000


def write(name, value, protocol):
    with open(name, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as out:
        pickle.dump(value, out, protocol=protocol)


def main():
    x = []
    for _ in range(DEPTH):
        x = [x]
    write("deep_list_p5.pickle.gz", x, 5)
    d = {}
    for _ in range(DEPTH):
        d = {"a": d}
    write("deep_dict_p4.pickle.gz", d, 4)


sys.setrecursionlimit(10 * DEPTH)
threading.stack_size(1 << 30)
thread = threading.Thread(target=main)
thread.start()
thread.join()
