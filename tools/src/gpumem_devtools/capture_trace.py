"""Capture allocation traces of real PyTorch steps as gpumem-trace v1 files.

Every allocation and free (address, requested bytes) of the steps is
recorded -- on CPU with torch.profiler(profile_memory=True), on a GPU with
torch.cuda.memory._record_memory_history -- from before the model is built, so
memory live when the first step starts (weights, buffers) opens the trace as
allocs. Models are public architectures built from config.json files with
random weights (gpumem_devtools/configs.py). Needs the [torch] extra, except
for --list and --help.

Usage (inside the gpumem checkout, whose testdata/ is the default output):
  gpumem-capture-trace                          # the committed set
  gpumem-capture-trace --only gpt2 --out-dir /tmp/t
  gpumem-capture-trace --device cuda --out-dir /tmp/gpu
  gpumem-capture-trace --config my/config.json \\
      --mode train --batch 4 --seq 256 --steps 4 --name mine --out-dir /tmp/t
(or `python -m gpumem_devtools.capture_trace ...`)
"""

import argparse
import gc
import json
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import configs, tracefile
from ._cli import device, fail, positive_int, probability, regex
from ._deps import MissingDependency, require
from .paths import repo_root
from .settings import (AMP_NAMES, ATTN_IMPLS, DTYPE_NAMES, MODES, OPTIMIZER_IMPLS, OPTIMIZERS,
                       Settings)

PROG = "gpumem-capture-trace"
OUT_DIR = "testdata/traces"
CONFIG_DIR = "testdata/traces/configs"

# Defaults of the options for one trace of your own (they apply only with --config).
CUSTOM_DEFAULTS: dict[str, Any] = {
    "mode": "train", "batch": 2, "dtype": "fp32", "optimizer": "adamw",
    "optimizer_impl": "foreach", "steps": 3,
}
CUSTOM_OPTIONS = ("name", "mode", "batch", "seq", "image_size", "new_tokens", "dtype", "amp",
                  "optimizer", "optimizer_impl", "attn", "loss", "steps", "lora_rank",
                  "lora_targets", "lora_dropout", "quant")
CUSTOM_SWITCHES = ("grad_ckpt", "labels", "cache", "hold_outputs")
# `--quant`: a bitsandbytes 4-bit base (workloads.four_bit_base).
QUANTS = ("nf4", "nf4:double")
# `--loss` of a trace of your own: "none" backpropagates from the logits' sum.
LOSSES = ("none",)


def _train(batch: int, seq: int | None, **kw: Any) -> Settings:
    kw.setdefault("optimizer", "adamw")
    kw.setdefault("optimizer_impl", "foreach")
    kw.setdefault("attn", "sdpa")
    return Settings("train", batch, seq, **kw)


# name -> (config name, settings, steps)
TRACES: dict[str, tuple[str, Settings, int]] = {
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

# (name, config file, settings, steps, config label written to the trace's meta)
Job = tuple[str, Path, Settings, int, str]


def capture(name: str, config_path: Path, s: Settings, steps: int, device: str,
            config_label: str) -> tuple[str, dict[str, Any], list[tracefile.Event]]:
    """(source, meta, events) of `steps` steps of `s` on the model of `config_path`."""
    torch = require("torch")
    transformers = require("transformers")
    from .recorder import recorder_for
    from .workloads import run

    rec = recorder_for(device)
    with rec:
        run(config_path, s, rec, steps, device)
    tl = rec.timeline()
    events, stats = tracefile.window(tl)
    meta: dict[str, Any] = {
        "config": config_label, "device": device, "steps": steps,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(),
        "dropped_unmatched_frees": tl.unmatched_frees,
        "dropped_duplicate_allocs": tl.duplicate_allocs,
        "free_size_mismatches": tl.size_mismatches}
    if s.lora_rank:
        meta["peft"] = require("peft").__version__
    if s.quant:
        meta["bitsandbytes"] = require("bitsandbytes").__version__
    meta.update({k: v for k, v in s.as_dict().items() if v is not None})
    meta.update(stats)
    return rec.source, meta, events


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out-dir", type=Path,
                    help=f"where the traces go (default: <checkout>/{OUT_DIR})")
    ap.add_argument("--repo", type=Path,
                    help="the gpumem checkout (default: the one holding the current directory)")
    ap.add_argument("--only", type=regex, metavar="REGEX",
                    help="capture only the committed traces whose name matches")
    ap.add_argument("--list", action="store_true",
                    help="print the names of the committed traces (after --only) and exit")
    ap.add_argument("--device", type=device, default="cpu",
                    help="cpu (default), cuda or cuda:N")
    ap.add_argument("--threads", type=positive_int, default=2,
                    help="torch CPU threads (default 2)")
    custom = ap.add_argument_group("one trace of your own (instead of the committed set)")
    custom.add_argument("--config", type=Path,
                        help="a HF config.json or gpumem's JSON of a torchvision model")
    custom.add_argument("--name", help="trace name (default: the config file's stem)")
    custom.add_argument("--mode", choices=MODES, help="default train")
    custom.add_argument("--batch", type=positive_int, help="default 2")
    custom.add_argument("--seq", type=positive_int, help="sequence length (text models)")
    custom.add_argument("--image-size", type=positive_int)
    custom.add_argument("--new-tokens", type=positive_int, help="tokens to generate (generate)")
    custom.add_argument("--dtype", choices=DTYPE_NAMES, help="default fp32")
    custom.add_argument("--amp", choices=AMP_NAMES)
    custom.add_argument("--optimizer", choices=OPTIMIZERS, help="default adamw (train)")
    custom.add_argument("--optimizer-impl", choices=OPTIMIZER_IMPLS,
                        help="default foreach (train)")
    custom.add_argument("--grad-ckpt", action="store_true")
    custom.add_argument("--attn", choices=ATTN_IMPLS)
    custom.add_argument("--loss", choices=LOSSES,
                        help="train: none runs the forward without labels and backpropagates "
                             "from outputs.logits.sum() (default: the model's own loss)")
    custom.add_argument("--labels", action="store_true",
                        help="infer: the batch carries labels = input_ids (the model's own loss)")
    custom.add_argument("--cache", action="store_true",
                        help="infer: use_cache left at the config's default (True), so the "
                             "forward returns its KV cache (default: use_cache=False)")
    custom.add_argument("--lora-rank", type=positive_int,
                        help="train: PEFT LoRA adapters of this rank on a frozen base")
    custom.add_argument("--lora-targets",
                        help="with --lora-rank: PEFT's target_modules, comma-separated module "
                             "names (default: all-linear)")
    custom.add_argument("--lora-dropout", type=probability,
                        help="with --lora-rank: PEFT's lora_dropout (default 0)")
    custom.add_argument("--quant", choices=QUANTS,
                        help="with --lora-rank: a bitsandbytes 4-bit base (every decoder "
                             "layer's linear an NF4 Linear4bit), as fsdp_qlora loads QLoRA")
    custom.add_argument("--hold-outputs", action="store_true",
                        help="train, the model's own loss: the loop keeps the outputs through "
                             "backward and the optimizer step (AnswerDotAI's fsdp_qlora)")
    custom.add_argument("--steps", type=positive_int, help="default 3")
    return ap


def _custom_settings(ap: argparse.ArgumentParser, args: argparse.Namespace) -> Settings:
    """The Settings of --config and its options (ap.error on inconsistent ones)."""
    for key, value in CUSTOM_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    try:
        cfg = json.loads(args.config.read_text())
    except OSError as err:
        ap.error(f"--config: cannot read {args.config}: {err.strerror or err}")
    except ValueError as err:
        ap.error(f"--config: {args.config} is not JSON: {err}")
    try:
        kind = configs.model_kind(cfg)
    except (AttributeError, KeyError, IndexError, TypeError):
        ap.error(f"--config: {args.config} names no architecture "
                 "(a HF config.json with 'architectures', or gpumem's JSON of a torchvision "
                 "model)")
    text = kind not in ("torchvision", "image_cls", "vision_tower")
    if text and args.seq is None:
        ap.error(f"--seq is required for {args.config} (a text model)")
    if not text and args.seq is not None:
        ap.error(f"--seq does not apply to {args.config} (an image model)")
    if args.mode == "generate":
        if kind != "causal_lm":
            ap.error("--mode generate needs a decoder-only LM config")
        if args.new_tokens is None:
            ap.error("--mode generate needs --new-tokens")
    elif args.new_tokens is not None:
        ap.error("--new-tokens applies only to --mode generate")
    train = args.mode == "train"
    if train and args.optimizer == "adafactor" and args.optimizer_impl == "fused":
        ap.error("--optimizer adafactor has no fused implementation")
    if args.grad_ckpt and kind == "torchvision":
        ap.error("--grad-ckpt is not defined for torchvision models")
    for switch in ("labels", "cache"):
        if getattr(args, switch) and args.mode != "infer":
            ap.error(f"--{switch} applies only to --mode infer")
    if args.loss is not None and not train:
        ap.error("--loss applies only to --mode train")
    if args.lora_rank is not None and not train:
        ap.error("--lora-rank applies only to --mode train")
    for option in ("lora_targets", "lora_dropout", "quant"):
        if getattr(args, option) is not None and args.lora_rank is None:
            ap.error(f"--{option.replace('_', '-')} needs --lora-rank")
    if args.hold_outputs and (not train or args.loss is not None):
        ap.error("--hold-outputs applies only to --mode train with the model's own loss")
    if args.cache and kind not in configs.KV_CACHE_KINDS:
        ap.error(f"--cache needs a model with a KV cache (decoder or encoder-decoder), "
                 f"not {args.config}")
    return Settings(args.mode, args.batch, args.seq, args.image_size, args.new_tokens,
                    args.dtype, args.amp, args.optimizer if train else None,
                    args.optimizer_impl if train and args.optimizer != "none" else None,
                    args.grad_ckpt, args.attn, no_cache=False if args.cache else None,
                    labels=args.labels, loss=args.loss, lora_rank=args.lora_rank,
                    lora_targets=args.lora_targets, lora_dropout=args.lora_dropout,
                    hold_outputs=args.hold_outputs, quant=args.quant)


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.config is not None:
        if args.only is not None or args.list:
            ap.error("--only and --list select from the committed traces, not with --config")
        s = _custom_settings(ap, args)
    else:
        given = [f"--{k.replace('_', '-')}" for k in CUSTOM_OPTIONS
                 if getattr(args, k) is not None] + [
                     f"--{k.replace('_', '-')}" for k in CUSTOM_SWITCHES if getattr(args, k)]
        if given:
            ap.error(f"{', '.join(given)}: only for a trace of your own (with --config)")
        names = [n for n in TRACES if args.only is None or args.only.search(n)]
        if args.list:
            if names:
                print("\n".join(names))
            return 0
        if not names:
            ap.error(f"--only {args.only.pattern!r} matches no committed trace "
                     f"(--list shows them)")

    root: Path | None = None
    if args.config is None or args.out_dir is None:
        try:
            root = repo_root(args.repo)
        except ValueError as err:
            ap.error(str(err))
    try:
        torch = require("torch")
        require("transformers")
    except MissingDependency as err:
        return fail(ap.prog, err)
    torch.set_num_threads(args.threads)

    jobs: list[Job]
    if args.config is not None:
        jobs = [(args.name or args.config.stem, args.config, s, args.steps, str(args.config))]
    else:
        assert root is not None
        cfg_names = sorted({TRACES[n][0] for n in names})
        configs.write_configs(root / CONFIG_DIR, cfg_names)
        jobs = []
        for n in names:
            cfg, s, steps = TRACES[n]
            label = f"{CONFIG_DIR}/{cfg}.json"
            jobs.append((n, root / label, s, steps, label))

    if args.out_dir is not None:
        out_dir: Path = args.out_dir
    else:
        assert root is not None
        out_dir = root / OUT_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        for name, cfg_path, s, steps, label in jobs:
            source, meta, events = capture(name, cfg_path, s, steps, args.device, label)
            path = out_dir / f"{name}.jsonl.gz"
            tracefile.write(path, name, source, meta, events)
            gc.collect()
            print(f"{path}: {meta['events']} events, {meta['steps']} steps, peak "
                  f"{meta['peak_live_bytes'] / 2**20:.1f} MiB, "
                  f"{path.stat().st_size / 1024:.0f} KiB", flush=True)
    except MissingDependency as err:
        return fail(ap.prog, err)
    return 0


if __name__ == "__main__":
    sys.exit(main())
