"""Log, operator by operator, what CUDA's caching allocator holds while measured cases run.

For every aten operator a case runs (the forward, the backward in autograd's own thread, the
optimizer), the bytes PyTorch had allocated before it, at its peak and after it, with the
shapes, dtypes and storage bytes of its outputs and of its first tensor inputs. It is what
`gpumem-measure-peak` reduces to one number, op by op: where a GPU's kernels allocate other
than the CPU's (workspaces, a reduction's staging buffer, a fused kernel's output layout, a
path SDPA picks), each visible as the op whose peak or output differs. Needs the [torch]
extra and a CUDA device, except for --show and --help.

Usage (inside the gpumem checkout):
  gpumem-op-log --out /tmp/ops.jsonl.gz t5-small-4l-train-b4-s256-fp32-adamw-foreach-sdpa
  gpumem-op-log --show /tmp/ops.jsonl.gz [CASE_ID] [--around 40]
(cases of any `gpumem-measure-peak` grid, by id; `gpumem-measure-peak --list` lists them).

Each line of the gzipped JSON-lines file is one case: {"id", "device", "versions", "ops"},
each op `[name, allocated_before, peak, allocated_after, outputs, inputs]` with a tensor as
`[shape, dtype, storage_bytes]`; the workload's phase boundaries are ops named `#step`,
`#forward`, `#backward`, ... The peak is the allocator's: it includes every cuBLAS workspace
the process has made, which `gpumem-measure-peak`'s per-case peaks leave out when an earlier
case made them.
"""

import argparse
import gzip
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ._cli import device, device_type, fail
from ._deps import MissingDependency, require
from .paths import repo_root

PROG = "gpumem-op-log"

Op = list[Any]


def describe(value: Any) -> Any:
    """A tensor as [shape, dtype, storage bytes]; a sequence as the list of its tensors'."""
    torch = require("torch")
    if isinstance(value, torch.Tensor):
        return [list(value.shape), str(value.dtype).removeprefix("torch."),
                value.untyped_storage().nbytes()]
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value if isinstance(v, torch.Tensor)]
    return None


def op_logger(allocated: Callable[[], int], peak: Callable[[], int],
              reset_peak: Callable[[], None], inputs_kept: int = 3) -> Any:
    """A TorchDispatchMode that appends one op row to its `ops` per aten operator, reading the
    allocator through the three callables (CUDA's `memory_allocated`, `max_memory_allocated`
    and `reset_peak_memory_stats`; any counters in tests)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpLogger(TorchDispatchMode):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[Op] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            before = allocated()
            reset_peak()
            out = func(*args, **(kwargs or {}))
            tensors = [d for d in map(describe, args) if d is not None]
            self.ops.append([func.overloadpacket.__name__, before, peak(), allocated(),
                             describe(out), tensors[:inputs_kept]])
            return out

        def boundary(self, label: str) -> None:
            """Mark a phase boundary of the workload (`#label`)."""
            now = allocated()
            self.ops.append([f"#{label}", now, now, now, None, []])

    return OpLogger()


class _MarkingRecorder:
    """The workload's recorder, also marking its phase boundaries in the op log."""

    def __init__(self, inner: Any, log: Any) -> None:
        self._inner, self._log = inner, log

    def boundary(self, label: str) -> None:
        self._log.boundary(label)
        self._inner.boundary(label)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __enter__(self) -> "_MarkingRecorder":
        self._inner.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._inner.__exit__(*exc)


def all_cases() -> dict[str, tuple[str, Any]]:
    """Every case of every `gpumem-measure-peak` grid, by id: (config name, settings)."""
    from . import measure_peak as mp

    grids = [mp.grid, mp.heldout_grid, mp.architectures_grid, mp.multimodal_grid,
             mp.settings_grid, mp.lora_grid, mp.losses_grid, mp.litgpt_grid, mp.diffusion_grid]
    return {mp.case_id(name, s): (name, s) for g in grids for name, s in g()}


def log_case(root: Path, name: str, s: Any, dev: str) -> list[Op]:
    """The op rows of one case run on CUDA device `dev`, as `gpumem-measure-peak` runs it."""
    from .measure_peak import CONFIG_DIR, STEPS
    from .recorder import recorder_for
    from .workloads import run

    torch = require("torch")
    cuda = torch.cuda
    with cuda.device(torch.device(dev)):
        cuda.empty_cache()
        log = op_logger(cuda.memory_allocated, cuda.max_memory_allocated,
                        cuda.reset_peak_memory_stats)
        rec = _MarkingRecorder(recorder_for(dev), log)
        with log, rec:
            run(root / CONFIG_DIR / f"{name}.json", s, rec, STEPS, dev)
    return list(log.ops)


def last_step(ops: Sequence[Op]) -> int:
    """Index of the last `#step` boundary (0 without one)."""
    marks = [i for i, op in enumerate(ops) if op[0] == "#step"]
    return marks[-1] if marks else 0


def show(ops: Sequence[Op], around: int) -> str:
    """The ops around the last step's peak, one line each (MB before, at the peak, after)."""
    start = last_step(ops)
    if start >= len(ops):
        return "no ops"
    at = max(range(start, len(ops)), key=lambda i: ops[i][2])
    lines = [f"peak {ops[at][2]:,} B at op {at} of {len(ops)} (last step from op {start})"]
    for i in range(max(start, at - around), min(len(ops), at + around // 4 + 1)):
        name, before, peak, after, outputs, inputs = ops[i]
        mark = ">" if i == at else " "
        lines.append(f"{mark}{i:6d} {name:42.42s} {before / 1e6:10.2f} {peak / 1e6:10.2f} "
                     f"{after / 1e6:10.2f}  {json.dumps(outputs)[:70]} <- {json.dumps(inputs)[:70]}")
    return "\n".join(lines)


def read_log(path: Path) -> dict[str, dict[str, Any]]:
    """The cases of an op log file, by id."""
    try:
        with gzip.open(path, "rt") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, EOFError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a gzipped JSON-lines op log ({err})") from None
    cases = {}
    for n, row in enumerate(rows, 1):
        if not isinstance(row, dict) or not isinstance(row.get("id"), str) \
                or not isinstance(row.get("ops"), list):
            raise ValueError(f"{path}: line {n} is not a case with an id and its ops")
        cases[row["id"]] = row
    return cases


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("cases", nargs="*", metavar="CASE_ID",
                    help="case ids to log (or, with --show, to print; default: all in the file)")
    ap.add_argument("--out", type=Path, help="the gzipped JSON-lines file to write")
    ap.add_argument("--device", type=device, default="cuda", help="cuda (default) or cuda:N")
    ap.add_argument("--repo", type=Path,
                    help="the gpumem checkout (default: the one holding the current directory)")
    ap.add_argument("--show", type=Path, metavar="FILE",
                    help="print the ops around each case's last-step peak from FILE")
    ap.add_argument("--around", type=int, default=40, metavar="N",
                    help="with --show: ops before the peak to print (default 40)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.show is not None:
        try:
            cases = read_log(args.show)
        except ValueError as err:
            return fail(ap.prog, err)
        missing = [c for c in args.cases if c not in cases]
        if missing:
            return fail(ap.prog, f"{args.show} has no case {', '.join(missing)} "
                                 f"(it has: {', '.join(cases)})")
        for cid in args.cases or list(cases):
            print(f"{cid}\n{show(cases[cid]['ops'], args.around)}\n")
        return 0
    if device_type(args.device) != "cuda":
        ap.error(f"--device {args.device}: the log reads CUDA's allocator; use cuda or cuda:N")
    if args.out is None or not args.cases:
        ap.error("give --out FILE and at least one CASE_ID (or --show FILE)")
    try:
        known = all_cases()
        unknown = [c for c in args.cases if c not in known]
        if unknown:
            ap.error(f"no such case: {', '.join(unknown)} (gpumem-measure-peak --list)")
        root = repo_root(args.repo)
        torch = require("torch")
        if not torch.cuda.is_available():
            return fail(ap.prog, "no CUDA device: PyTorch sees none")
        from .measure_peak import versions

        with gzip.open(args.out, "wt") as out:
            for cid in args.cases:
                t0 = time.time()
                name, s = known[cid]
                ops = log_case(root, name, s, args.device)
                out.write(json.dumps({"id": cid, "device": torch.cuda.get_device_name(),
                                      "versions": versions(), "ops": ops}) + "\n")
                print(f"{cid}: {len(ops)} ops, peak {max(o[2] for o in ops):,} B "
                      f"in {time.time() - t0:.1f}s", flush=True)
    except (MissingDependency, ValueError) as err:
        return fail(ap.prog, err)
    return 0


if __name__ == "__main__":
    sys.exit(main())
