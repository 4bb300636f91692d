#!/usr/bin/env python3
"""Capture allocation traces of real PyTorch steps as gpumem-trace v1 files.

Every allocation and free (address, requested bytes) of the steps is
recorded -- on CPU with torch.profiler(profile_memory=True), on a GPU with
torch.cuda.memory._record_memory_history -- from before the model is built, so
memory live when the first step starts (weights, buffers) opens the trace as
allocs. Models are public architectures built from config.json files with
random weights (gpumem_torch/configs.py).

Usage:
  /work/torchenv/bin/python tools/capture_trace.py              # the committed set
  /work/torchenv/bin/python tools/capture_trace.py --only gpt2 --out-dir /tmp/t
  /work/torchenv/bin/python tools/capture_trace.py --device cuda --out-dir /tmp/gpu
  /work/torchenv/bin/python tools/capture_trace.py --config my/config.json \\
      --mode train --batch 4 --seq 256 --steps 4 --name mine --out-dir /tmp/t
"""

import argparse
import gc
import platform
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpumem_torch import configs, tracefile  # noqa: E402
from gpumem_torch.recorder import recorder_for  # noqa: E402
from gpumem_torch.workloads import Settings, run  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
OUT_DIR = REPO / "testdata/traces"
CONFIG_DIR = "testdata/traces/configs"


def _train(batch, seq, **kw):
    kw.setdefault("optimizer", "adamw")
    kw.setdefault("optimizer_impl", "foreach")
    kw.setdefault("attn", "sdpa")
    return Settings("train", batch, seq, **kw)


# name -> (config name, settings, steps)
TRACES = {
    "gpt2-124m-train-b4-s256": ("gpt2", _train(4, 256), 3),
    "gpt2-12l-train-b4-s256": ("gpt2-12l", _train(4, 256), 4),
    "gpt2-12l-train-ckpt-b4-s256": ("gpt2-12l", _train(4, 256, grad_ckpt=True), 4),
    "tinyllama-8l-train-amp-bf16-fused-b4-s512": (
        "tinyllama-8l", _train(4, 512, amp="bf16", optimizer_impl="fused"), 3),
    "bert-12l-train-b8-s128": ("bert-12l", _train(8, 128), 3),
    "resnet50-train-b8-img128": (
        "resnet50", _train(8, None, image_size=128, attn=None), 3),
    "tinyllama-8l-generate-b4-s128-new64": (
        "tinyllama-8l", Settings("generate", 4, 128, new_tokens=64, attn="sdpa"), 3),
    "gpt2-12l-infer-b8-s256": ("gpt2-12l", Settings("infer", 8, 256, attn="sdpa"), 4),
    # A few hundred events: the source of the snapshot-pickle and RMM-CSV fixtures.
    "small-gpt2-2l-infer-b1-s32": ("gpt2-2l", Settings("infer", 1, 32, attn="sdpa"), 2),
}


def capture(name, config_path, s, steps, device, config_label):
    rec = recorder_for(device)
    with rec:
        run(config_path, s, rec, steps, device)
    tl = rec.recording.timeline()
    events, stats = tracefile.window(tl)
    import transformers
    meta = {"config": config_label, "device": device, "steps": steps,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(),
            "dropped_unmatched_frees": tl.unmatched_frees,
            "dropped_duplicate_allocs": tl.duplicate_allocs,
            "free_size_mismatches": tl.size_mismatches}
    meta.update({k: v for k, v in s.as_dict().items() if v is not None})
    meta.update(stats)
    return rec.source, meta, events


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", type=Path, default=OUT_DIR)
    ap.add_argument("--only", help="regex: capture only the named traces that match")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--threads", type=int, default=2)
    custom = ap.add_argument_group("one trace of your own (instead of the committed set)")
    custom.add_argument("--config", type=Path, help="a HF config.json or gpumem CNN JSON")
    custom.add_argument("--name")
    custom.add_argument("--mode", default="train", choices=["train", "infer", "generate"])
    custom.add_argument("--batch", type=int, default=2)
    custom.add_argument("--seq", type=int)
    custom.add_argument("--image-size", type=int)
    custom.add_argument("--new-tokens", type=int)
    custom.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    custom.add_argument("--amp", choices=["bf16", "fp16"])
    custom.add_argument("--optimizer", default="adamw")
    custom.add_argument("--optimizer-impl", default="foreach")
    custom.add_argument("--grad-ckpt", action="store_true")
    custom.add_argument("--attn", choices=["eager", "sdpa"])
    custom.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    if args.config:
        train = args.mode == "train"
        s = Settings(args.mode, args.batch, args.seq, args.image_size, args.new_tokens,
                     args.dtype, args.amp, args.optimizer if train else None,
                     args.optimizer_impl if train else None, args.grad_ckpt, args.attn)
        jobs = [(args.name or args.config.stem, args.config, s, args.steps, str(args.config))]
    else:
        names = [n for n in TRACES if not args.only or re.search(args.only, n)]
        if args.list:
            print("\n".join(names))
            return
        cfg_names = sorted({TRACES[n][0] for n in names})
        configs.write_configs(REPO / CONFIG_DIR, cfg_names)
        jobs = []
        for n in names:
            cfg, s, steps = TRACES[n]
            label = f"{CONFIG_DIR}/{cfg}.json"
            jobs.append((n, REPO / label, s, steps, label))

    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, cfg_path, s, steps, label in jobs:
        source, meta, events = capture(name, cfg_path, s, steps, args.device, label)
        path = args.out_dir / f"{name}.jsonl.gz"
        tracefile.write(path, name, source, meta, events)
        gc.collect()
        print(f"{path}: {meta['events']} events, {meta['steps']} steps, peak "
              f"{meta['peak_live_bytes'] / 2**20:.1f} MiB, {path.stat().st_size / 1024:.0f} KiB",
              flush=True)


if __name__ == "__main__":
    main()
