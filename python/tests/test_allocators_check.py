"""The pure parts of python/checks/allocators_gpu.py (the GPU allocators check): its schedule,
run order, verdicts and table, on crafted results. No torch needed: the check imports it only
inside the functions that run a workload."""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import sys
from typing import Any

import pytest

CHECK = pathlib.Path(__file__).resolve().parents[1] / "checks" / "allocators_gpu.py"
GIB = 1 << 30


def _load() -> Any:
    spec = importlib.util.spec_from_file_location("allocators_gpu", CHECK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["allocators_gpu"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


ag = _load()


def run(workload: str, allocator: str, rep: int = 1, *, reserved: int | None = 10 * GIB,
        step_ms: list[float] | None = None, losses: list[float] | None = None,
        status: str = "ok", **extra: Any) -> dict[str, Any]:
    """One run record as the orchestration writes it."""
    record = {"workload": workload, "allocator": allocator, "rep": rep, "status": status,
              "exit_status": 0 if status == "ok" else 1, "peak_reserved": reserved,
              "peak_allocated": None if reserved is None else reserved - GIB,
              "step_ms": [10.0] * 20 if step_ms is None else step_ms,
              "losses": [2.5, 2.25, 2.0] if losses is None else losses}
    record.update(extra)
    return record


def results(runs: list[dict[str, Any]], workloads: list[str] | None = None,
            allocators: list[str] | None = None, deterministic: bool = True,
            sanitizer: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"config": {"workloads": workloads or list(ag.WORKLOADS),
                       "allocators": allocators or list(ag.ALLOCATORS),
                       "deterministic": deterministic},
            "runs": runs, "sanitizer": sanitizer or {}}


def by_name(verdicts: list[Any]) -> dict[str, Any]:
    return {v.name: v for v in verdicts}


def test_the_check_imports_torch_only_inside_functions():
    tree = ast.parse(CHECK.read_text())
    top = [alias.name for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
           for alias in node.names]
    assert top and not any("torch" in name or "gpumem" in name for name in top)


def test_the_schedule_is_the_same_on_every_call_and_differs_per_workload():
    for scale in ag.SCALES.values():
        for workload in ag.WORKLOADS:
            assert ag.schedule(workload, scale) == ag.schedule(workload, scale)
        assert ag.schedule("llama-train", scale) != ag.schedule("resnet50-train", scale)


def test_variable_length_steps_keep_the_token_budget_within_the_range():
    scale = ag.SCALES["gpu"]
    steps = ag.schedule("gpt2-varlen", scale)
    assert len(steps) == scale.warmup + scale.steps
    assert len({s["seq"] for s in steps}) > 5  # a new length nearly every step
    for step in steps:
        assert scale.gpt2_seq[0] <= step["seq"] <= scale.gpt2_seq[1]
        assert step["batch"] == scale.gpt2_tokens // step["seq"]


def test_serving_requests_have_random_shapes_within_their_ranges():
    scale = ag.SCALES["gpu"]
    requests = ag.schedule("llama-serve", scale)
    assert len(requests) == scale.serve_warmup + scale.requests == 14
    for r in requests:
        assert scale.serve_batch[0] <= r["batch"] <= scale.serve_batch[1]
        assert scale.serve_prompt[0] <= r["prompt"] <= scale.serve_prompt[1]
        assert scale.serve_new[0] <= r["new"] <= scale.serve_new[1]
    assert ag.warmup_of("llama-serve", scale) == 2
    assert ag.warmup_of("llama-train", scale) == 5


def test_every_gpu_run_times_at_least_twenty_steps():
    scale = ag.SCALES["gpu"]
    assert scale.steps >= 20 and scale.warmup >= 1


def test_repetitions_are_interleaved():
    plan = ag.plan_runs(["a", "b"], ["x", "y"], 2)
    assert plan == [(1, "a", "x"), (1, "a", "y"), (1, "b", "x"), (1, "b", "y"),
                    (2, "a", "x"), (2, "a", "y"), (2, "b", "x"), (2, "b", "y")]


def test_each_child_gets_only_its_own_allocator_settings(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    monkeypatch.setenv("GPUMEM_HARD_LIMIT", "1GiB")
    env = ag.child_env("gpumem-expandable", deterministic=True)
    assert env["GPUMEM_POOL"] == "expandable" and env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env and "GPUMEM_HARD_LIMIT" not in env
    env = ag.child_env("pytorch-async", deterministic=False)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "backend:cudaMallocAsync"
    assert "GPUMEM_POOL" not in env and "CUBLAS_WORKSPACE_CONFIG" not in env


def test_losses_compare_exactly_and_say_where_and_how_much():
    assert ag.compare_losses([1.0, 2.0], [1.0, 2.0])["identical"]
    assert ag.compare_losses([float("nan")], [float("nan")])["identical"]
    c = ag.compare_losses([1.0, 2.0, 3.0], [1.0, 2.5, 3.25])
    assert c == {"identical": False, "first_step": 1, "max_abs_diff": 0.5}
    assert ag.compare_losses([1.0, 2.0], [1.0])["first_step"] == 1


def full_results(gpumem_reserved: int, expandable_reserved: int, pytorch_reserved: int,
                 gpumem_ms: float, pytorch_ms: float) -> dict[str, Any]:
    """Two repetitions of every workload under pytorch, pytorch-expandable and gpumem."""
    runs = []
    for rep in (1, 2):
        for w in ag.WORKLOADS:
            runs += [run(w, "pytorch", rep, reserved=pytorch_reserved, step_ms=[pytorch_ms] * 20),
                     run(w, "pytorch-expandable", rep, reserved=expandable_reserved),
                     run(w, "gpumem-gpumem", rep, reserved=gpumem_reserved,
                         step_ms=[gpumem_ms] * 20)]
    return results(runs, allocators=["pytorch", "pytorch-expandable", "gpumem-gpumem"])


def test_goals_pass_when_gpumem_reserves_less_and_keeps_pace():
    r = full_results(gpumem_reserved=9 * GIB, expandable_reserved=10 * GIB,
                     pytorch_reserved=12 * GIB, gpumem_ms=10.2, pytorch_ms=10.0)
    verdicts = [*ag.goal_reserved_vs_expandable(r), *ag.goal_varlen_saving(r),
                *ag.goal_step_time(r)]
    assert len(verdicts) == 9
    assert all(v.ok is True for v in verdicts), verdicts
    names = by_name(verdicts)
    assert "llama-serve_gpumem_serving_time_within_3pct" in names
    assert "(-25.0 %)" in names["gpt2-varlen_gpumem_reserved_5pct_below_pytorch"].detail


def test_goals_fail_when_gpumem_reserves_more_or_is_slower():
    r = full_results(gpumem_reserved=11 * GIB, expandable_reserved=10 * GIB,
                     pytorch_reserved=int(11.3 * GIB), gpumem_ms=10.4, pytorch_ms=10.0)
    verdicts = [*ag.goal_reserved_vs_expandable(r), *ag.goal_varlen_saving(r),
                *ag.goal_step_time(r)]
    assert all(v.ok is False for v in verdicts), verdicts
    assert "+4.0 %" in by_name(verdicts)["llama-train_gpumem_step_time_within_3pct"].detail


def test_serving_is_judged_on_the_time_to_serve_every_request():
    # The same median request, but gpumem's total is 10 % longer.
    runs = [run("llama-serve", "pytorch", step_ms=[10.0, 10.0, 10.0]),
            run("llama-serve", "gpumem-gpumem", step_ms=[10.0, 10.0, 13.0])]
    r = results(runs, workloads=["llama-serve"], allocators=["pytorch", "gpumem-gpumem"])
    (verdict,) = ag.goal_step_time(r)
    assert verdict.ok is False and "33.00 ms vs 30.00 ms" in verdict.detail


def test_step_time_is_not_judged_where_pytorchs_own_runs_disagree_beyond_3pct():
    def case(second_pytorch_ms: float) -> Any:
        runs = [run("gpt2-varlen", "pytorch", 1, step_ms=[150.0] * 20),
                run("gpt2-varlen", "pytorch", 2, step_ms=[second_pytorch_ms] * 20),
                run("gpt2-varlen", "gpumem-gpumem", 1, step_ms=[170.0] * 20)]
        r = results(runs, workloads=["gpt2-varlen"], allocators=["pytorch", "gpumem-gpumem"])
        (verdict,) = ag.goal_step_time(r)
        return verdict

    noisy = case(124.0)
    assert noisy.ok is None and "differ by 21.0 %: too noisy" in noisy.detail
    assert case(151.0).ok is False


def test_goals_are_ignored_when_not_measured():
    runs = [run("gpt2-varlen", "pytorch", reserved=None),
            run("gpt2-varlen", "gpumem-gpumem", reserved=None),
            run("gpt2-varlen", "pytorch-expandable", status="skipped")]
    r = results(runs, workloads=["gpt2-varlen"])
    for verdict in [*ag.goal_reserved_vs_expandable(r), *ag.goal_varlen_saving(r)]:
        assert verdict.ok is None and verdict.detail == "not measured"


def test_a_failed_run_fails_its_check_and_a_skipped_one_is_ignored():
    runs = [run("resnet50-train", "pytorch"),
            run("resnet50-train", "gpumem-gpumem", status="failed",
                error="RuntimeError: CUDA error: an illegal memory access was encountered"),
            run("resnet50-train", "gpumem-torch", status="skipped")]
    r = results(runs, workloads=["resnet50-train"],
                allocators=["pytorch", "gpumem-gpumem", "gpumem-torch"])
    verdicts = by_name(ag.check_runs(r))
    assert verdicts["resnet50-train_pytorch_no_cuda_error"].ok is True
    failed = verdicts["resnet50-train_gpumem-gpumem_no_cuda_error"]
    assert failed.ok is False and "illegal memory access" in failed.detail
    assert verdicts["resnet50-train_gpumem-torch_no_cuda_error"].ok is None


def test_different_losses_fail_beyond_pytorchs_own_run_to_run_noise():
    def case(reference_rep2: list[float] | None, mine: list[float]) -> Any:
        runs = [run("llama-train", "pytorch", 1),
                run("llama-train", "gpumem-gpumem", 1, losses=mine)]
        if reference_rep2 is not None:
            runs.append(run("llama-train", "pytorch", 2, losses=reference_rep2))
        r = results(runs, workloads=["llama-train"], allocators=["pytorch", "gpumem-gpumem"])
        return ag.check_losses(r)[0]

    deterministic = case([2.5, 2.25, 2.0], [2.5, 2.25, 2.0625])
    assert deterministic.ok is False
    assert "rep 1: differ from step 2, max |difference| 0.0625" in deterministic.detail
    # PyTorch's own runs differ by 0.01: 0.0312 is within 4 × that, 0.0625 is not.
    assert case([2.5, 2.25, 2.01], [2.5, 2.25, 2.03125]).ok is True
    noisy = case([2.5, 2.25, 2.01], [2.5, 2.25, 2.0625])
    assert noisy.ok is False and "not deterministic; allowed 0.04" in noisy.detail
    assert case([2.5, 2.25, 2.01], [2.5, 2.25, float("nan")]).ok is False
    assert case([2.5, 2.25, 2.01], [2.5, 2.25]).ok is False
    single = case(None, [2.5, 2.25, 2.0625])
    assert single.ok is None and "one run of PyTorch" in single.detail
    same = results([run("llama-train", "pytorch"), run("llama-train", "gpumem-torch")],
                   workloads=["llama-train"], allocators=["pytorch", "gpumem-torch"])
    assert ag.check_losses(same)[0].ok is True
    loose = dict(same, config=dict(same["config"], deterministic=False))
    assert ag.check_losses(loose)[0].ok is None


def test_replay_must_give_the_runs_peak_reserved_to_the_byte():
    exact = run("llama-train", "gpumem-gpumem", 1, reserved=5 * GIB,
                replay={"peak_reserved": 5 * GIB, "peak_allocated": 4 * GIB, "events": 90})
    off = run("llama-train", "gpumem-torch", 1, reserved=5 * GIB,
              replay={"peak_reserved": 5 * GIB + (2 << 20), "peak_allocated": 4 * GIB,
                      "events": 90})
    broken = run("llama-train", "gpumem-expandable", 1, replay={"error": "gpumem replay exited 2"})
    dry = run("llama-train", "gpumem-gpumem", 2, reserved=None)
    torch_run = run("llama-train", "pytorch", 1)
    verdicts = by_name(ag.check_replays(results([exact, off, broken, dry, torch_run])))
    assert len(verdicts) == 4
    assert verdicts["llama-train_gpumem-gpumem_rep1_replay_equals_reserved"].ok is True
    mismatch = verdicts["llama-train_gpumem-torch_rep1_replay_equals_reserved"]
    assert mismatch.ok is False and "(+2097152 B)" in mismatch.detail
    assert verdicts["llama-train_gpumem-expandable_rep1_replay_equals_reserved"].ok is False
    assert verdicts["llama-train_gpumem-gpumem_rep2_replay_equals_reserved"].ok is None


@pytest.mark.parametrize("status, output, child, verdict", [
    (0, "========= ERROR SUMMARY: 0 errors\n", {"losses": []}, "clean"),
    (99, "========= Invalid __global__ read of size 4 bytes\n"
         "========= ERROR SUMMARY: 1 error\n", {"losses": []}, "errors"),
    (1, "========= ERROR SUMMARY: 0 errors\n", {"error": "RuntimeError: boom"}, "failed"),
    (1, "========= Error: Target application terminated before first instrumented API call\n",
     None, "refused"),
    (None, "still loading\n", None, "unfinished"),
])
def test_memcheck_outcomes(status, output, child, verdict):
    got, detail = ag.sanitizer_verdict(status, output, child)
    assert got == verdict
    if verdict == "errors":
        assert "Invalid __global__ read" in detail
    if verdict == "refused":
        assert "terminated before first instrumented API call" in detail


def test_memcheck_verdicts():
    r = results([], workloads=["llama-train", "gpt2-varlen", "llama-serve"], sanitizer={
        "llama-train": {"verdict": "clean", "detail": "ERROR SUMMARY: 0 errors"},
        "gpt2-varlen": {"verdict": "errors", "detail": "========= Invalid read"},
        "llama-serve": {"verdict": "not installed", "detail": "not installed"}})
    verdicts = by_name(ag.check_memcheck(r))
    assert verdicts["llama-train_memcheck_clean"].ok is True
    assert verdicts["gpt2-varlen_memcheck_clean"].ok is False
    assert verdicts["llama-serve_memcheck_clean"].ok is None


def test_the_table_has_a_row_per_workload_and_allocator_with_the_figures():
    runs = [run("gpt2-varlen", "pytorch", 1, reserved=int(18.56 * GIB), step_ms=[40.0] * 20),
            run("gpt2-varlen", "pytorch", 2, reserved=int(18.56 * GIB), step_ms=[42.0] * 20),
            run("gpt2-varlen", "gpumem-gpumem", 1, reserved=int(12.5 * GIB),
                step_ms=[41.0] * 20, losses=[2.5, 2.5, 2.0],
                replay={"peak_reserved": int(12.5 * GIB), "peak_allocated": 0, "events": 1}),
            run("gpt2-varlen", "gpumem-gpumem", 2, status="failed",
                error="RuntimeError: cuDNN error: CUDNN_STATUS_EXECUTION_FAILED\ntrace")]
    r = results(runs, workloads=["gpt2-varlen"], allocators=["pytorch", "gpumem-gpumem"],
                sanitizer={"gpt2-varlen": {"verdict": "refused", "detail": "refused to run"}})
    table = ag.render_table(r)
    lines = table.splitlines()
    assert lines[0].startswith("| workload | allocator | median ms (rep 1 / rep 2) |")
    reference = next(line for line in lines if "| pytorch |" in line)
    assert "| 40.00 / 42.00 | 18.56 | (reference) |" in reference
    assert "rep 1 = rep 2" in reference
    ours = next(line for line in lines if "| gpumem-gpumem |" in line)
    assert "| 41.00 | 12.50 | -32.7 % |" in ours
    assert "no: rep 1 from step 1, max 0.25" in ours
    assert "| yes |" in ours
    assert "rep 2 failed: RuntimeError: cuDNN error: CUDNN_STATUS_EXECUTION_FAILED |" in ours
    assert "| gpt2-varlen | refused: refused to run |" in table


def test_every_verdict_has_a_name_the_gpu_check_table_can_read():
    r = full_results(9 * GIB, 10 * GIB, 12 * GIB, 10.0, 10.0)
    for verdict in ag.all_verdicts(r):
        assert " " not in verdict.name and verdict.name.isascii()
