"""Real PyTorch runs (opt-in: GPUMEM_DEVTOOLS_TORCH_TESTS=1 with the [torch] extra installed).

With the versions the committed data was made with (tools/README.md), the results must
match it exactly; with others, they must be self-consistent.
"""

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, SMALL, TRACES

from gpumem_devtools import capture_trace, measure_peak, tracefile

pytestmark = pytest.mark.torch


def _same_versions(versions: dict[str, Any]) -> bool:
    import torch
    import transformers
    return (versions.get("torch"), versions.get("transformers")) == (
        torch.__version__, transformers.__version__)


def _check_trace(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    header, events = tracefile.read(path)
    live: dict[int, int] = {}
    current = peak = 0
    for ev in events:
        if ev["op"] == "alloc":
            live[ev["addr"]] = ev["size"]
            current += ev["size"]
        elif ev["op"] == "free":
            assert live.pop(ev["addr"]) == ev["size"]
            current -= ev["size"]
        peak = max(peak, current)
    meta = header["meta"]
    assert int(meta["peak_live_bytes"]) == peak > 0
    assert int(meta["final_live_bytes"]) == current
    assert int(meta["events"]) == len(events)
    assert meta["dropped_unmatched_frees"] == meta["free_size_mismatches"] == "0"
    return header, events


def test_self_test(fake_repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert measure_peak.main(["--self-test", "--repo", str(fake_repo)]) == 0
    out = capsys.readouterr().out
    assert out.endswith("self-test passed\n")
    assert "FAIL" not in out


def test_capture_the_small_trace(fake_repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert capture_trace.main(["--repo", str(fake_repo), "--only", "^small-",
                               "--out-dir", str(out)]) == 0
    assert (fake_repo / "testdata/traces/configs/gpt2-2l.json").read_bytes() == (
        TRACES / "configs/gpt2-2l.json").read_bytes()
    header, events = _check_trace(out / "small-gpt2-2l-infer-b1-s32.jsonl.gz")
    committed_header, committed = tracefile.read(f"{SMALL}.jsonl.gz")
    assert header["name"] == committed_header["name"]
    assert header["meta"]["config"] == committed_header["meta"]["config"]
    if _same_versions(committed_header["meta"]):
        # Addresses differ from run to run; sizes, order and peaks do not.
        def shape(evs: list[dict[str, Any]]) -> list[tuple[str, Any]]:
            return [(e["op"], e.get("size", e.get("index"))) for e in evs]
        assert shape(events) == shape(committed)
        for key in ("initial_live_bytes", "peak_live_bytes", "final_live_bytes", "steps"):
            assert header["meta"][key] == committed_header["meta"][key], key


def test_capture_a_trace_of_your_own(tmp_path: Path) -> None:
    assert capture_trace.main(["--config", str(TRACES / "configs/gpt2-2l.json"), "--mode",
                               "train", "--batch", "1", "--seq", "16", "--steps", "2",
                               "--name", "mine", "--out-dir", str(tmp_path)]) == 0
    header, events = _check_trace(tmp_path / "mine.jsonl.gz")
    meta = header["meta"]
    assert (meta["mode"], meta["batch"], meta["seq"], meta["optimizer"],
            meta["optimizer_impl"], meta["steps"]) == ("train", "1", "16", "adamw", "foreach", "2")
    assert [e["index"] for e in events if e["op"] == "step"] == [0, 1]


def test_measure_one_case(fake_repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "measured.jsonl"
    case = "gpt2-2l-infer-b1-s128-fp32-sdpa"
    assert measure_peak.main(["--repo", str(fake_repo), "--only", f"^{case}$",
                              "--out", str(out)]) == 0
    [row] = [json.loads(line) for line in out.read_text().splitlines()]
    committed = {r["id"]: r for r in map(json.loads, (REPO / "testdata/plan/measured.jsonl")
                                         .read_text().splitlines())}[case]
    assert row["id"] == case
    assert row["measured"]["phase"] == "forward"
    for key in ("config", "settings", "notes"):
        assert row[key] == committed[key], key
    if _same_versions(committed["versions"]):
        assert row["measured"] == committed["measured"]
    # Already measured: kept, not redone.
    before = out.read_bytes()
    assert measure_peak.main(["--repo", str(fake_repo), "--only", f"^{case}$",
                              "--out", str(out)]) == 0
    assert out.read_bytes() == before


def test_op_log_records_each_operator_with_the_counters_it_is_given() -> None:
    import torch

    from gpumem_devtools import op_log

    # Stand-in counters: each read of `allocated` advances it by 100, the peak is 1000 more.
    state = {"allocated": 0, "resets": 0}

    def allocated() -> int:
        state["allocated"] += 100
        return state["allocated"]

    def reset() -> None:
        state["resets"] += 1

    log = op_log.op_logger(allocated, lambda: state["allocated"] + 1000, reset)
    a = torch.ones(4, 3)
    with log:
        log.boundary("step")
        (a @ a.T).sum()
    names = [op[0] for op in log.ops]
    assert names[0] == "#step" and "mm" in names and names[-1] == "sum"
    mm = log.ops[names.index("mm")]
    assert mm[1] < mm[3] < mm[2]
    assert mm[4] == [[4, 4], "float32", 64]
    assert mm[5][0] == [[4, 3], "float32", 48]
    assert state["resets"] == len(log.ops) - 1
    assert op_log.last_step(log.ops) == 0
    assert op_log.show(log.ops, 2).startswith("peak ")


def test_measure_context_says_plainly_when_there_is_no_cuda_device(
        capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    from gpumem_devtools import measure_context
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: tools/README.md says how to measure it")
    assert measure_context.main([]) == measure_context.NO_DEVICE == 77
    assert "PyTorch sees no CUDA device; nothing measured" in capsys.readouterr().err


def test_measure_distributed_on_a_gpu_says_plainly_when_there_is_none(
        capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    from gpumem_devtools import measure_distributed
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: scripts/gpu-fsdp.sh measures it")
    assert measure_distributed.main(["--device", "cuda"]) == 77
    assert "sees no CUDA device; nothing measured" in capsys.readouterr().err


def test_measure_distributed_fake_rank_matches_the_gloo_ranks(tmp_path: Path) -> None:
    """Rank 0 alone on the fake process group allocates what it allocates beside a real
    second rank over gloo (gloo's own copies aside, which the peak here does not meet)."""
    import json

    from gpumem_devtools import measure_distributed
    case = "llama-8l-train-b4-s512-fsdp1-bf16-ckpt-lora8-gpus2"
    out = tmp_path / "fake.jsonl"
    assert measure_distributed.main(["--fake", "--only", case, "--out", str(out)]) == 0
    fake = json.loads(out.read_text())["measured"]
    committed = REPO / measure_distributed.OUT
    gloo = next(json.loads(line)["measured"] for line in committed.read_text().splitlines()
                if json.loads(line)["id"] == case)
    assert abs(fake["per_rank"][0] - gloo["per_rank"][0]) < 200_000
