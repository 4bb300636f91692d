#!/usr/bin/env python3
"""Records which PYTORCH_CUDA_ALLOC_CONF strings PyTorch's own parser accepts (needs torch;
runs on CPU through torch._C._accelerator_setAllocatorSettings, the parser CUDA uses).

The parser keeps its settings for the life of the process, so every string is tried in a fresh
interpreter. Writes torch_conf_verdicts.json: [{conf, accepted, message}], for the Rust test
that checks gpumem's TorchSettings::parse accepts and refuses the same strings.
Run from this directory: python3 make_torch_conf_verdicts.py
"""
import json
import subprocess
import sys

import torch

CONFS = [
    "",
    "max_split_size_mb:20",
    "max_split_size_mb:19",
    "max_split_size_mb:128",
    "max_split_size_mb:40,large_segment_size_mb:80",
    "large_segment_size_mb:80,max_split_size_mb:40",
    "large_segment_size_mb:80,max_split_size_mb:80",
    "large_segment_size_mb:80,max_split_size_mb:200",
    "large_segment_size_mb:10",
    "large_segment_size_mb:11",
    "large_segment_size_mb:40",
    "max_non_split_rounding_mb:10",
    "max_non_split_rounding_mb:20",
    "max_non_split_rounding_mb:64",
    "large_segment_size_mb:40,max_non_split_rounding_mb:30",
    "large_segment_size_mb:40,max_non_split_rounding_mb:40",
    "max_non_split_rounding_mb:30,large_segment_size_mb:40",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:3",
    "roundup_power2_divisions:1",
    "roundup_power2_divisions:0",
    "roundup_power2_divisions:[8:1,16:2,>:1]",
    "roundup_power2_divisions:[256:4,>:2]",
    "roundup_power2_divisions:[3:4]",
    "garbage_collection_threshold:0.5",
    "garbage_collection_threshold:1.0",
    "garbage_collection_threshold:0",
    "expandable_segments:True",
    "expandable_segments:False",
    "expandable_segments:yes",
    "expandable_segments:True,large_segment_size_mb:80",
    "backend:native",
    # backend:cudaMallocAsync is left out: on a machine without CUDA the parser fails on the
    # missing backend, not on the string.
    "bogus:1",
    "max_split_size_mb",
    "max_split_size_mb:abc",
    "max_split_size_mb:128,garbage_collection_threshold:0.6,expandable_segments:False",
    "pinned_use_background_threads:True",
    "release_lock_on_cudamalloc:True",
]

PROBE = "import sys, torch; torch._C._accelerator_setAllocatorSettings(sys.argv[1])"


def verdict(conf: str) -> dict:
    run = subprocess.run([sys.executable, "-c", PROBE, conf], capture_output=True, text=True)
    lines = [l for l in run.stderr.splitlines() if "Error" in l or "must" in l or "invalid" in l]
    return {"conf": conf, "accepted": run.returncode == 0,
            "message": lines[-1].strip() if run.returncode else ""}


def main() -> None:
    out = {"torch": torch.__version__, "verdicts": [verdict(c) for c in CONFS]}
    with open("torch_conf_verdicts.json", "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
