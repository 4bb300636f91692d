"""How long ``gpumem.plan`` takes from Python (pytest-benchmark; ``bash scripts/bench-python.sh``),
beside the extension call alone (the Rust library plus its JSON, no dataclasses): the example
of the docs, Llama-3-8B training at batch 4, sequence 2048, bf16, checkpointing, on an A100
80GB. The Rust side alone is ``cargo bench -p gpumem-replay --bench plan_report``."""

import json

import gpumem
from gpumem import _gpumem

RUN = dict(model="llama-3-8b", mode="train", batch=4, seq=2048, amp="bf16", grad_ckpt=True,
           gpu="a100-80gb")


def test_plan_estimated(benchmark):
    result = benchmark(gpumem.plan, reserved="estimate", **RUN)
    assert result.reserved_by == "estimate"


def test_extension_call_estimated(benchmark):
    request = json.dumps(dict(RUN, reserved="estimate"))
    assert benchmark(_gpumem.plan, request).startswith("{")


def test_plan_replayed(benchmark):
    result = benchmark(gpumem.plan, **RUN)
    assert result.reserved_by == "replay"
