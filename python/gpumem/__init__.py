"""gpumem: predictable GPU memory for deep learning.

- :func:`plan` / :func:`fit` predict the peak memory per GPU of a training or inference run and
  find the batch that fits (no GPU needed);
- :func:`replay` replays an allocation trace (a file, or a snapshot dict straight from
  ``torch.cuda.memory._snapshot()``) through gpumem's allocator policies;
- :mod:`gpumem.torch` and :mod:`gpumem.cupy` run PyTorch and CuPy on gpumem's caching pool.

``plan``, ``fit`` and ``replay`` run the ``gpumem`` command (``python -m gpumem``) and return its
JSON as a :class:`Result`, so their fields are exactly the command's ``--json`` fields. Errors
are :class:`GpumemError` carrying the Rust error's text.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from typing import Any, Iterable, Mapping

from gpumem._gpumem import GpumemError, OutOfMemoryError

__all__ = ["GpumemError", "OutOfMemoryError", "Result", "plan", "fit", "replay", "run_cli"]
__version__ = "0.1.0"


class Result(dict):
    """The command's JSON object; fields read as keys or attributes (``r.peak_total_bytes``),
    nested objects likewise."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(
                f"{type(self).__name__} has no field {name!r}; fields: {', '.join(self)}"
            ) from None

    @staticmethod
    def wrap(value: Any) -> Any:
        """`value` with every JSON object in it as a Result."""
        if isinstance(value, Mapping):
            return Result({k: Result.wrap(v) for k, v in value.items()})
        if isinstance(value, list):
            return [Result.wrap(v) for v in value]
        return value


def _flags(options: Mapping[str, Any]) -> list[str]:
    """Keyword arguments as command-line flags: ``grad_ckpt=True`` → ``--grad-ckpt``,
    ``batch=4`` → ``--batch 4``; ``None`` and ``False`` are left out."""
    flags: list[str] = []
    for name, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            flags.append(flag)
        else:
            flags += [flag, str(value)]
    return flags


def run_cli(args: Iterable[str]) -> str:
    """Runs ``gpumem ARGS`` in a child Python (``python -m gpumem``) and returns its standard
    output; a failure raises GpumemError with the command's message."""
    argv = [sys.executable, "-m", "gpumem", *map(str, args)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        message = done.stderr.strip().removeprefix("gpumem: ")
        raise GpumemError(message or f"gpumem exited with status {done.returncode}")
    return done.stdout


def _json(args: Iterable[str]) -> Result:
    return Result.wrap(json.loads(run_cli([*args, "--json"])))


def plan(model: str | None = None, *, config: str | os.PathLike[str] | None = None,
         **options: Any) -> Result:
    """Predicts the peak memory per GPU of a run: ``gpumem plan --json`` with the keyword
    arguments as its flags (``mode="train"``, ``batch=4``, ``seq=2048``, ``amp="bf16"``,
    ``grad_ckpt=True``, ``gpu="a100-80gb"``, ``zero="3"``, ``gpus=8``, …; see
    ``python -m gpumem plan --help``). ``model`` is a catalogue name or Hugging Face id;
    ``config`` a path to a Hugging Face config.json instead.

    Returns the JSON's fields: ``peak_total_bytes``, ``peak_allocated_bytes``,
    ``peak_reserved_bytes``, ``peak_phase``, ``breakdown``, ``phases``, ``advice``,
    ``workload``, ``warnings``, and ``gpu``/``fit``/``min_gpus``/``plan_that_fits`` when asked.
    """
    return _json(["plan", *_flags({"model": model, "config": config, **options})])


def fit(model: str | None = None, *, gpu: str, target: str = "batch", **options: Any) -> Result:
    """Finds the largest ``target`` (``"batch"`` or ``"seq"``) that fits ``gpu`` (a name such as
    ``"h100"`` or a size such as ``"24GiB"``): :func:`plan` with ``fit=target``; the result's
    ``fit`` field holds the value, usable bytes and accumulation."""
    return plan(model, gpu=gpu, fit=target, **options)


def replay(trace: str | os.PathLike[str] | Mapping[str, Any] | None = None, *,
           policies: str | Iterable[str] = "all", capacity: str | int | None = None,
           **options: Any) -> Result:
    """Replays an allocation trace through gpumem's policies: ``gpumem replay --json``.

    ``trace`` is a file (gpumem JSON lines, a PyTorch snapshot pickle, an RMM log; gzip or not),
    or a snapshot dict as ``torch.cuda.memory._snapshot()`` returns it, or None for the bundled
    GPT-2 trace. ``policies`` is ``"all"``, one name, or several (one replay each, the reports
    joined). ``capacity`` is a device size (``"24GiB"`` or bytes) to check for OOM. Other
    keyword arguments are the command's flags (``pytorch_alloc_conf=``, ``smallest_capacity=True``,
    ``device=``, ``format=``).

    Returns ``trace`` (name, source, events, steps, peak_live_bytes), ``capacity_bytes`` and
    ``policies``: one report per policy with ``peak_allocated_bytes``, ``peak_reserved_bytes``,
    ``utilization``, ``device_calls``, ``oom`` and the rest of the command's fields.
    """
    names = [policies] if isinstance(policies, str) else list(policies)
    if not names:
        raise GpumemError("policies is empty; accepted: 'all', a policy name, or a list of them")
    with tempfile.TemporaryDirectory(prefix="gpumem-replay-") as scratch:
        if isinstance(trace, Mapping):
            path = os.path.join(scratch, "snapshot.pickle")
            with open(path, "wb") as out:
                pickle.dump(dict(trace), out)
            options.setdefault("format", "pytorch")
            trace = path
        head = ["replay"] + ([os.fspath(trace)] if trace is not None else [])
        results = [
            _json(head + _flags({"policy": name, "capacity": capacity, **options}))
            for name in names
        ]
    joined = results[0]
    for more in results[1:]:
        joined["policies"] += more["policies"]
    return joined
