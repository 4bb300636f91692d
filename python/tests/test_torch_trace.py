"""gpumem.torch.trace's PyTorch-free half (gpumem._steptrace): the record of allocations and
frees driven by hand as PyTorch's dispatcher would drive it, CUDA's rounding, the step peaks
and what is live there, the gpumem trace built in memory and replayed in-process, the GPU's
facts from the planner, and the StepTrace result. The PyTorch half runs in
python/checks/torch_trace_cpu.py (scripts/test-torch-cpu.sh)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys

import pytest

import gpumem
import gpumem.torch as gt
from gpumem import _steptrace
from gpumem._steptrace import Recorder, cuda_rounded

MIB = 1 << 20


def test_cuda_rounding_is_the_caching_allocators():
    assert [cuda_rounded(n) for n in (0, 1, 511, 512, 513, 1024, 3 * MIB + 1)] == [
        0, 512, 512, 512, 1024, 1024, 3 * MIB + 512]


def training_run(steps: int = 2) -> tuple[Recorder, dict[str, object]]:
    """A linear layer's steps as the dispatcher reports them: weight (4 MiB) from setup,
    per step an input, an activation, a gradient that stays until zero_grad, a temporary of
    the backward, and an optimizer state made in the first step only."""
    rec = Recorder()
    weight = rec.alloc(4 * MIB, kind="parameter", name="fc.weight")
    state = None
    for step in range(steps):
        rec.start_step()
        x = rec.alloc(1000)
        rec.set_phase("forward")
        rec.enter_module("fc")
        y = rec.alloc(2 * MIB, op="aten.mm.default")
        rec.exit_module()
        rec.set_phase("backward")
        rec.backward_module("fc")
        tmp = rec.alloc(MIB, op="aten.mm.default")
        grad = rec.alloc(4 * MIB, op="aten.mm.default")
        grad.kind, grad.name = "gradient", "fc.weight"
        rec.free(tmp)
        rec.free(y)
        rec.set_phase("optimizer")
        if state is None:
            state = rec.alloc(4 * MIB, op="aten.zeros_like.default")
            state.kind, state.name = "optimizer_state", "fc.weight.exp_avg"
            counter = rec.alloc(4, op="aten.scalar_tensor.default")
            counter.host = True
        rec.set_phase("zero_grad")
        rec.free(grad)
        rec.free(x)
    return rec, {"weight": weight, "state": state}


def test_the_recorder_labels_each_allocation_with_step_phase_module_and_kind():
    rec, made = training_run()
    allocs = [m for is_alloc, m in rec.events if is_alloc]
    assert [(m.step, m.phase, m.module, m.kind) for m in allocs[:7]] == [
        (None, "setup", "", "parameter"),
        (0, "inputs", "", "input"),
        (0, "forward", "fc", "activation"),
        (0, "backward", "fc", "temporary"),
        (0, "backward", "fc", "gradient"),
        (0, "optimizer", "", "optimizer_state"),
        (0, "optimizer", "", "temporary"),
    ]
    assert rec.step_starts == [1, 11]
    # Live at the end: the weight, the state and the host counter.
    assert [m.name for m in rec.live() if not m.host] == ["fc.weight", "fc.weight.exp_avg"]


def test_zero_bytes_and_a_second_free_record_nothing():
    rec = Recorder()
    assert rec.alloc(0) is None
    made = rec.alloc(10)
    rec.free(made)
    rec.free(made)
    rec.free(None)
    assert [is_alloc for is_alloc, _ in rec.events] == [True, False]
    rec.recording = False
    assert rec.alloc(10) is None


def test_bad_phase_or_kind_is_refused():
    rec = Recorder()
    with pytest.raises(ValueError, match="unknown phase 'fwd'"):
        rec.set_phase("fwd")
    with pytest.raises(ValueError, match="unknown kind 'weights'"):
        rec.alloc(1, kind="weights")


def test_step_peaks_are_in_cuda_blocks_and_know_what_is_live():
    rec, _ = training_run()
    first, last = _steptrace.step_peaks(rec)
    # Step 0: weight 4 + x 1024 B + y 2 + tmp 1 + grad 4 MiB = 11 MiB + 1024 in backward,
    # then weight + x + grad + the new state: 12 MiB + 1024 in the optimizer step.
    assert first.allocated == 12 * MIB + 1024
    assert first.phase == "optimizer"
    # Step 1 has the state from the start: the backward's peak is 4 MiB more.
    assert last.allocated == 15 * MIB + 1024
    assert last.requested == 15 * MIB + 1000
    assert sorted(m.kind for m in last.live) == sorted(
        ["parameter", "optimizer_state", "input", "activation", "temporary", "gradient"])
    assert last.phases == {"inputs": 8 * MIB + 1024, "forward": 10 * MIB + 1024,
                           "backward": 15 * MIB + 1024}


def test_a_step_that_allocates_nothing_peaks_at_what_it_began_with():
    rec = Recorder()
    rec.alloc(3 * MIB, kind="parameter")
    rec.start_step()
    (peak,) = _steptrace.step_peaks(rec)
    assert peak.allocated == 3 * MIB and peak.phase == "inputs" and len(peak.live) == 1


def test_the_native_trace_replays_in_process_with_the_same_peak():
    rec, _ = training_run()
    text = _steptrace.native_trace(rec, name="linear", meta={"steps": "2"})
    lines = [json.loads(line) for line in text.decode().splitlines()]
    assert lines[0] == {"gpumem_trace": 1, "name": "linear", "source": "gpumem.torch.trace",
                        "device_total": None, "meta": {"steps": "2"}}
    assert [e["index"] for e in lines if e.get("op") == "step"] == [0, 1]
    # The host counter is not in the trace; every free names a live address.
    assert all(e.get("size") != 4 for e in lines[1:])
    replay = gpumem.replay(text, format="native", policies=["torch", "gpumem"])
    assert replay.trace.steps == 2 and replay.trace.events == len(lines) - 1
    torch_policy = replay.policies[0]
    assert torch_policy.peak_allocated_bytes == 15 * MIB + 1024
    assert torch_policy.peak_reserved_bytes >= torch_policy.peak_allocated_bytes


def test_gpu_facts_are_the_planners():
    h100 = _steptrace.gpu_facts("H100")
    assert (h100.name, h100.memory_bytes, h100.blas_workspace_bytes) == (
        "h100", 81_559 * MIB, 32 * MIB)
    assert h100.context_bytes > 0
    a100 = _steptrace.gpu_facts("a100-80gb")
    assert a100.blas_workspace_bytes == 8 * MIB + 128 * 1024
    sized = _steptrace.gpu_facts("24GiB")
    assert sized.memory_bytes == 24 << 30
    default = _steptrace.gpu_facts(None)
    assert default.name is None and default.memory_bytes is None
    with pytest.raises(gpumem.PlanError, match="unknown GPU `h1000`.*did you mean h100"):
        _steptrace.gpu_facts("h1000")


def test_a_gpu_in_bytes_is_planned_at_that_size():
    # The planner's sizes have no bytes unit: an int goes as an exact decimal of MiB.
    assert _steptrace.planner_gpu(24 << 30) == "24576MiB"
    assert _steptrace.planner_gpu("24GiB") == "24GiB"
    for nbytes in (24 << 30, 1000 * MIB + 1, 1):
        assert _steptrace.gpu_facts(nbytes).memory_bytes == nbytes
    assert dataclasses.replace(_steptrace.gpu_facts(24 << 30), name="24GiB") == \
        _steptrace.gpu_facts("24GiB")
    for wrong in (True, 24.5, b"h100"):
        with pytest.raises(TypeError, match="gpu must be a GPU name or size as a str"):
            _steptrace.gpu_facts(wrong)
    for wrong in (0, -1):
        with pytest.raises(ValueError, match="size in bytes and must be positive"):
            _steptrace.gpu_facts(wrong)


def step_trace(gpu: str | None):
    rec, _ = training_run()
    facts = _steptrace.gpu_facts(gpu)
    replay = _steptrace.replay_trace(_steptrace.native_trace(rec, name="linear"), facts)
    return _steptrace.result(rec, facts=facts, replay=replay, steps=2, amp=None,
                             mapped=["rounding"], seconds=0.5, top=3)


def test_the_result_holds_the_last_steps_peak_the_replay_and_the_fit():
    result = step_trace("h100")
    assert isinstance(result, gpumem.results.StepTrace)
    assert result.peak_allocated_bytes == 15 * MIB + 1024
    assert (result.peak_step, result.peak_phase, result.peak_module) == (1, "backward", "fc")
    assert result.step_peaks == [12 * MIB + 1024, 15 * MIB + 1024]
    assert sum(result.breakdown.values()) == result.peak_allocated_bytes
    assert result.breakdown["gradient"] == 4 * MIB and result.breakdown["blas_workspace"] == 0
    assert [p.policy for p in result.policies] == ["torch", "expandable", "gpumem"]
    assert result.peak_reserved_bytes == result.policies[0].peak_reserved_bytes
    assert result.peak_total_bytes == result.peak_reserved_bytes + result.context_bytes
    assert result.gpu is not None and result.gpu.fits and result.gpu.name == "h100"
    assert [t.bytes for t in result.largest_tensors] == [4 * MIB] * 3
    assert {t.kind for t in result.largest_tensors} <= {"parameter", "gradient",
                                                         "optimizer_state"}
    # Parameters, their gradients and states belong to the module that owns them.
    assert result.largest_modules[0].module == "fc"
    assert result.largest_modules[0].bytes == 15 * MIB
    assert result.replay.capacity_bytes == 81_559 * MIB - result.context_bytes
    again = gpumem.results.StepTrace.from_dict(result.to_dict())
    assert again == result and json.loads(json.dumps(result.to_dict())) == result.to_dict()


def test_a_gpu_too_small_does_not_fit_and_the_replay_says_where():
    facts = _steptrace.gpu_facts(None)
    small = f"{(facts.context_bytes + 8 * MIB) // MIB}MiB"
    result = step_trace(small)
    assert result.gpu is not None and not result.gpu.fits
    assert result.replay.policies[0].oom is not None
    assert step_trace(None).gpu is None


def test_import_gpumem_torch_needs_no_pytorch_and_trace_says_what_it_needs():
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("PyTorch is installed here: python/checks/torch_trace_cpu.py covers it")
    code = ("import sys, gpumem.torch as gt; assert 'torch' not in sys.modules; "
            "assert 'trace' in gt.__all__; gt.trace\n"
            "try:\n    gt.trace(None, ())\nexcept ImportError as e:\n    print(e)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "gpumem.torch.trace needs PyTorch" in done.stdout


def test_trace_is_documented_with_what_is_mapped():
    doc = gt.trace.__doc__ or ""
    for words in ("FakeTensorMode", "512-byte", "cuBLAS", "1-byte mask", "flash", "What is not"):
        assert words in doc, words


def test_column_sum_staging_is_the_planners():
    # The figures crates/gpumem-plan/src/gpu.rs's column_sum_staging_matches_h200_traces holds
    # (PyTorch 2.11's column sums on an H200, read from its allocation history).
    h200 = _steptrace.gpu_facts("h200")
    for rows, cols, bytes_ in ((1024, 1024, 8_389_120), (2048, 8192, 134_218_240),
                               (1576, 1024, 13_107_712), (3000, 1536, 36_962_816),
                               (64, 1024, 0), (0, 1024, 0)):
        assert sum(_steptrace.column_sum_staging_bytes(rows, cols, h200)) == bytes_
    t4 = _steptrace.gpu_facts("t4")
    assert sum(_steptrace.column_sum_staging_bytes(2048, 8192, t4)) < 134_218_240


def test_gpu_generation_from_the_planners_facts():
    assert [_steptrace.gpu_facts(g).generation for g in ("h200", "b200", "a100", "rtx-4090",
                                                          "t4", "mi300x")] == \
        ["hopper", "hopper", "ampere", "ampere", "pre-ampere", "amd"]
