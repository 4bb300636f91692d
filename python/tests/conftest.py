"""Shared setup: the pools run on the simulated device (no GPU), configured only by the tests."""

from __future__ import annotations

import os
import pathlib

# Read when each device's pool is made, before any test touches one.
os.environ["GPUMEM_DEVICE"] = "sim"
os.environ["GPUMEM_SIM_CAPACITY"] = "4GiB"
for name in ("GPUMEM_POOL", "GPUMEM_SOFT_LIMIT", "GPUMEM_HARD_LIMIT", "GPUMEM_HISTORY",
             "GPUMEM_POLICY_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
    os.environ.pop(name, None)

REPO = pathlib.Path(__file__).resolve().parents[2]
TRACES = REPO / "testdata" / "traces"
