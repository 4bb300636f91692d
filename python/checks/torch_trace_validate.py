"""gpumem.torch.trace against the planner's measured sets (opt-in: needs PyTorch, transformers,
torchvision, peft and the repository's tools package; scripts/test-torch-cpu.sh runs
``--check``, scripts/bench-torch-trace.sh does not use it).

Each case is built exactly as ``gpumem-measure-peak`` built it when it was measured (the tools
package's ``build``, ``Workload.batch``, ``Workload.loss``, ``make_optimizer``; LoRA through
PEFT as ``workloads._with_lora``), wrapped in a module whose forward is the measured step's
forward + loss, and traced for two steps:

``--target cpu`` (``testdata/plan/measured*.jsonl``, measured on a CPU with PyTorch 2.15):
    the trace with its CUDA rules off (``_torch_trace.record(cuda_rules=False)``: the CPU's own
    kernels, no cuBLAS workspace), inside the harness's own CPU patches (CUDA-like dropout and
    fp16 softmax, CUDA's autocast lists: ``gpu_like_dropout``, ``gpu_like_softmax``,
    ``cuda_autocast_policy_on_cpu``), so that it runs what the measurement ran. The trace's
    last-step peak of requested bytes is compared with the measured peak (requested bytes of
    the CPU allocator's trace).
``--target h200`` (``testdata/plan/measured_cuda*.jsonl``, measured on an H200 with PyTorch
    2.11): ``gpumem.torch.trace(..., gpu="h200")``, its CUDA rules on; its peak allocated
    (512-byte blocks) compared with ``max_memory_allocated`` of the measured step.

Inference cases run their forward under ``no_grad`` in eval mode, as the harness does (the
step's loss is a constant, nothing to backpropagate). Generation cannot be traced: ``generate``
decides when to stop from the tokens' values, which fake tensors do not have.

    python python/checks/torch_trace_validate.py --target cpu --only 'gpt2-2l-train' --limit 3
    python python/checks/torch_trace_validate.py --target cpu --write testdata/plan/trace_validation.jsonl
    python python/checks/torch_trace_validate.py --check testdata/plan/trace_validation.jsonl

``--check FILE`` re-runs the committed cases named in the script's CHECK list and fails if a
traced figure differs from the committed one by more than 0.5 % (the same PyTorch and
transformers) or its error passes 3 %.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import pathlib
import re
import statistics
import sys
import time
from typing import Any

try:
    import torch
except ImportError:
    print("torch_trace_validate.py: skipped: PyTorch is not installed in this Python")
    raise SystemExit(0)

REPO = pathlib.Path(__file__).resolve().parents[2]

#: The cases ``--check`` re-runs (a few seconds each): a decoder, an encoder, an
#: encoder-decoder, a CNN, LoRA, autocast, checkpointing, inference; CPU and H200.
CHECK = [
    ("cpu", "gpt2-2l-train-b1-s128-fp32-adamw-foreach-sdpa"),
    ("cpu", "bert-2l-train-b4-s256-fp32-adamw-foreach-sdpa"),
    ("cpu", "resnet18-train-b8-img128-fp32-adamw-foreach"),
    ("h200", "bert-2l-train-b2-s128-fp32-adamw-foreach-sdpa"),
    ("h200", "vit-2l-infer-b16-img224-fp32-sdpa"),
]


def _tools() -> Any:
    try:
        from gpumem_devtools import models, workloads
        from gpumem_devtools.settings import Settings
    except ImportError as error:
        raise SystemExit(f"torch_trace_validate.py: needs the repository's tools package "
                         f"(pip install -e tools): {error}")
    return models, workloads, Settings


class Step(torch.nn.Module):
    """The measured step's forward and loss as a module (what the trace calls): training
    returns the loss (``Workload.loss`` or, with ``loss: none``, the outputs, whose logits'
    sum the loss function takes); inference runs the forward under ``no_grad`` and returns its
    output, kept to the step's end as the harness keeps it."""

    def __init__(self, workload: Any, settings: Any, extra: dict[str, Any]) -> None:
        super().__init__()
        self.model = workload.model
        self.spec = dataclasses.replace(workload, model=None)
        self.settings = settings
        self.extra = extra

    def forward(self, **inputs: Any) -> Any:
        wl = dataclasses.replace(self.spec, model=self.model)
        s = self.settings
        if s.mode == "infer":
            if wl.kind == "seq2seq" and not s.labels:
                inputs["decoder_input_ids"] = inputs["input_ids"]
            with torch.no_grad():
                return wl.model(**inputs, **self.extra)
        if s.loss is None:
            return wl.loss(**inputs, **self.extra)
        if s.loss == "none":
            return wl.model(**inputs, **self.extra)
        raise NotImplementedError(f"loss {s.loss!r} is not traced here")


def unsupported(row: dict[str, Any]) -> str | None:
    s = row["settings"]
    if s["mode"] == "generate":
        return "generate (stops on token values, which fake tensors do not have)"
    if s.get("loss") not in (None, "none"):
        return f"loss {s['loss']} (litgpt/torchtune not installed)"
    if s.get("framework"):
        return f"framework {s['framework']}"
    if s.get("transformers"):
        return f"transformers {s['transformers']}"
    return None


@contextlib.contextmanager
def measured_position_bias_mask(row: dict[str, Any]) -> Any:
    """T5's SDPA mask as the measured transformers made it. Up to 5.17 (the H200 sets),
    ``create_position_bias_mask`` returned the relative position bias as the model computed it,
    ``values.permute([2, 0, 1]).unsqueeze(0)``, whose last dimension is strided (the heads
    innermost), or ``where``/``+`` over it, which keeps that layout; 5.23 adds
    ``.contiguous()``. CUDA's fused kernels refuse a mask whose last stride is not 1
    (``check_last_dim_stride_equals_1_dense``), so the measured step ran the math path there:
    the case is traced with the measured release's layout, by dropping that copy."""
    measured = row.get("versions", {}).get("transformers", "")
    try:
        from transformers.integrations import sdpa_attention
    except ImportError:
        yield
        return
    original = getattr(sdpa_attention, "create_position_bias_mask", None)
    if original is None or not measured or \
            tuple(int(p) for p in measured.split(".")[:2]) > (5, 17):
        yield
        return

    def uncopied(position_bias: Any, attention_mask: Any, is_causal: bool, query: Any,
                 key: Any) -> Any:
        if attention_mask is None and not is_causal:
            return position_bias
        made = original(position_bias, attention_mask, is_causal, query, key)
        # where/+ over the permuted bias give the bias's layout (TensorIterator follows it).
        layout = torch.empty_like(position_bias.expand(made.shape))
        return layout.copy_(made) if layout.stride() != made.stride() else made

    sdpa_attention.create_position_bias_mask = uncopied
    try:
        yield
    finally:
        sdpa_attention.create_position_bias_mask = original


def trace_case(row: dict[str, Any], target: str) -> dict[str, Any]:
    """The traced peak of one measured case (``target`` cpu or h200)."""
    models, workloads, Settings = _tools()
    from gpumem import _steptrace, _torch_trace
    import gpumem.torch as gt

    s = Settings(**row["settings"])
    config = REPO / row["config"]
    cpu = target == "cpu"
    torch.manual_seed(0)
    with contextlib.ExitStack() as stack:
        if cpu:
            # The harness's own CPU patches, as the measurement ran them.
            stack.enter_context(models.gpu_like_dropout("cpu"))
            stack.enter_context(models.gpu_like_softmax("cpu"))
            if s.amp:
                models.cuda_autocast_policy_on_cpu()
        wl = models.build(config, s.dtype, s.attn, s.grad_ckpt, "cpu", s.image_size,
                          s.grad_ckpt_every, s.grad_ckpt_per_op)
        if s.lora_rank:
            wl.model = workloads._with_lora(wl.model, s.lora_rank, s.lora_targets,
                                            s.lora_dropout or 0.0)
        if s.freeze_vision_tower:
            workloads._vision_tower(wl.model).requires_grad_(False)
        extra = workloads._cache_argument(wl, s)
        optimizer = None
        zero = torch.zeros(())
        if s.mode == "train":
            wl.model.train()
            if s.optimizer != "none":
                optimizer = models.make_optimizer(s.optimizer, s.optimizer_impl,
                                                  wl.model.parameters())
            inputs = wl.batch(s.batch, s.seq, "cpu", models.DTYPES[s.dtype],
                              with_labels=s.loss is None)
            loss_fn = (lambda out: out.logits.sum()) if s.loss == "none" else None
        else:
            wl.model.eval()
            inputs = wl.batch(s.batch, s.seq, "cpu", models.DTYPES[s.dtype],
                              with_labels=s.labels)
            loss_fn = lambda out: zero  # noqa: E731
        step = Step(wl, s, extra)
        started = time.perf_counter()
        if cpu:
            recorder = _torch_trace.record(step, inputs, optimizer=optimizer, loss_fn=loss_fn,
                                           steps=2, amp=s.amp, cuda_rules=False)
            traced = _steptrace.step_peaks(recorder)[-1].requested
            out = {"traced": traced}
        else:
            stack.enter_context(measured_position_bias_mask(row))
            result = gt.trace(step, inputs, optimizer=optimizer, loss_fn=loss_fn, steps=2,
                              amp=s.amp, gpu="h200")
            workspace = result.blas_workspace_bytes
            out = {"traced": result.peak_allocated_bytes - workspace * row["_held_workspaces"],
                   "traced_reserved": result.peak_reserved_bytes
                   + workspace * row["_reserve_only_workspaces"],
                   "phase_traced": result.peak_phase}
        out["seconds"] = round(time.perf_counter() - started, 2)
    return out


def load(target: str) -> list[tuple[str, dict[str, Any]]]:
    pattern = "measured_cuda*.jsonl" if target == "h200" else "measured*.jsonl"
    rows = []
    for path in sorted((REPO / "testdata" / "plan").glob(pattern)):
        if target == "cpu" and path.name.startswith("measured_cuda"):
            continue
        if path.name == "measured_distributed.jsonl":
            continue
        # The H200 harness ran a file's cases in one process: the cuBLAS workspaces made by
        # earlier cases (the forward thread's at the first matrix product, the autograd
        # thread's at the first backward) are held before a case starts and are not in its
        # recorded peak, but are in its reserved (as crates/gpumem-replay/tests/cuda_measured.rs
        # plans them).
        forward_made = backward_made = False
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                training = row["settings"]["mode"] == "train"
                row["_held_workspaces"] = int(forward_made) + int(training and backward_made)
                row["_reserve_only_workspaces"] = int(not training and backward_made)
                forward_made, backward_made = True, backward_made or training
                rows.append((path.name, row))
    return rows


def run(target: str, only: str | None, limit: int | None, every: int,
        write: pathlib.Path | None = None) -> list[dict[str, Any]]:
    import transformers

    rows = load(target)
    if only:
        rows = [(f, r) for f, r in rows if re.search(only, r["id"])]
    rows = rows[::every]
    if limit:
        rows = rows[:limit]
    results = []
    date = datetime.date.today().isoformat()
    out = write.open("a") if write else None
    written = 0
    for name, row in rows:
        if out is not None:
            for entry in results[written:]:
                out.write(json.dumps(entry) + "\n")
            out.flush()
            written = len(results)
        why = unsupported(row)
        if why:
            print(f"skip {row['id']}: {why}", flush=True)
            continue
        measured = row["measured"]["peak_allocated_bytes"]
        try:
            got = trace_case(row, target)
        except Exception as error:  # noqa: BLE001 - reported per case
            print(f"FAIL {row['id']}: {type(error).__name__}: {str(error)[:300]}", flush=True)
            results.append({"id": row["id"], "set": name, "target": target,
                            "error_kind": f"{type(error).__name__}: {str(error)[:200]}"})
            continue
        error = got["traced"] / measured - 1
        entry = {"id": row["id"], "set": name, "target": target, "measured": measured,
                 "traced": got["traced"], "error": round(error, 5),
                 "phase_measured": row["measured"].get("phase")}
        if "traced_reserved" in got:
            entry["measured_reserved"] = row["measured"].get("peak_reserved_bytes")
            entry["traced_reserved"] = got["traced_reserved"]
            entry["phase_traced"] = got["phase_traced"]
        entry.update({"seconds": got["seconds"],
                      "versions": {"torch": torch.__version__,
                                   "transformers": transformers.__version__,
                                   "measured_with": row.get("versions", {})},
                      "date": date})
        results.append(entry)
        print(f"{row['id']:70s} measured {measured / 2**20:9.2f} MiB traced "
              f"{got['traced'] / 2**20:9.2f} MiB {error:+7.2%} ({got['seconds']:.1f} s)",
              flush=True)
    if out is not None:
        for entry in results[written:]:
            out.write(json.dumps(entry) + "\n")
        out.close()
    return results


def summary(results: list[dict[str, Any]]) -> str:
    ok = [r for r in results if "error" in r]
    if not ok:
        return "no case traced"
    errors = [abs(r["error"]) for r in ok]
    worst = max(ok, key=lambda r: abs(r["error"]))
    return (f"{len(ok)} cases ({len(results) - len(ok)} failed): median |error| "
            f"{statistics.median(errors):.2%}, max {max(errors):.2%} ({worst['id']})")


def check(path: pathlib.Path) -> int:
    committed = {(r["target"], r["id"]): r for r in
                 (json.loads(line) for line in path.read_text().splitlines() if line.strip())}
    failures = []
    for target, case in CHECK:
        want = committed.get((target, case))
        if want is None or "traced" not in want:
            failures.append(f"{target} {case}: not in {path}")
            continue
        row = next(r for _, r in load(target) if r["id"] == case)
        got = trace_case(row, target)["traced"]
        drift = got / want["traced"] - 1
        error = got / want["measured"] - 1
        print(f"{target} {case}: traced {got} committed {want['traced']} ({drift:+.3%}), "
              f"measured {want['measured']} ({error:+.2%})", flush=True)
        if abs(drift) > 0.005 or abs(error) > 0.03:
            failures.append(f"{target} {case}: drift {drift:+.3%}, error {error:+.2%}")
    for failure in failures:
        print("FAIL", failure)
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=("cpu", "h200"), default="cpu")
    parser.add_argument("--only", help="regex on case ids")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--every", type=int, default=1, help="every N-th case")
    parser.add_argument("--write", type=pathlib.Path, help="append the results (JSON lines)")
    parser.add_argument("--check", type=pathlib.Path,
                        help="re-run the CHECK cases against this committed file")
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.check:
        return check(args.check)
    results = run(args.target, args.only, args.limit, args.every, args.write)
    print(summary(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
