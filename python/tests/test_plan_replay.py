"""The in-process calls (plan, fit, replay, tune, report, policies, devices, selftest) return
typed results equal to the command's ``--json`` for the same arguments: compared with the gpumem
binary (GPUMEM_CLI, as scripts/test-python.sh passes it) or else ``python -m gpumem``."""

import json
import os
import pathlib
import pickle
import subprocess
import sys

import pytest

import gpumem
from gpumem import results
from conftest import TRACES

SMALL = TRACES / "small-gpt2-2l-infer-b1-s32.jsonl.gz"
SNAPSHOT = TRACES / "small-gpt2-2l-infer-b1-s32.snapshot.p4.pickle"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    binary = os.environ.get("GPUMEM_CLI")
    head = [binary] if binary else [sys.executable, "-m", "gpumem"]
    return subprocess.run([*head, *args], capture_output=True, text=True, check=False)


def cli_json(*args: str):
    done = cli(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def without_timings(value):
    """``value`` without the wall-clock fields, which differ between two runs."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items()
                if k not in ("events_per_second", "seconds")}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


PLAN_ARGS = dict(model="gpt2", mode="train", batch=4, seq=512, amp="bf16", grad_ckpt=True,
                 gpu="rtx-4090")
PLAN_FLAGS = ["--model", "gpt2", "--mode", "train", "--batch", "4", "--seq", "512", "--amp",
              "bf16", "--grad-ckpt", "--gpu", "rtx-4090"]


def test_plan_equals_the_command_and_is_typed():
    got = gpumem.plan(**PLAN_ARGS)
    assert got.to_dict() == cli_json("plan", *PLAN_FLAGS)
    assert isinstance(got, gpumem.Plan)
    assert isinstance(got.breakdown, results.Breakdown)
    assert all(isinstance(s, results.Suggestion) for s in got.advice)
    assert got.peak_total_bytes > got.peak_allocated_bytes > 0
    assert got.reserved_by == "replay"
    assert [r.policy for r in got.replay] == ["torch", "expandable", "gpumem"]
    assert got.gpu is not None and got.gpu.name == "rtx-4090"


def test_plan_by_estimate_equals_the_command():
    got = gpumem.plan(**PLAN_ARGS, reserved="estimate")
    assert got.to_dict() == cli_json("plan", *PLAN_FLAGS, "--reserved", "estimate")
    assert got.reserved_by == "estimate" and got.replay == []


def test_fit_finds_a_batch_and_equals_the_command():
    got = gpumem.fit(model="gpt2", gpu="24GiB", mode="train", seq=1024, min_gpus=True)
    assert got.to_dict() == cli_json("plan", "--model", "gpt2", "--gpu", "24GiB", "--fit",
                                     "batch", "--mode", "train", "--seq", "1024", "--min-gpus")
    assert got.fit is not None and got.fit.target == "batch" and got.fit.value >= 1
    assert got.min_gpus is not None and got.min_gpus.gpus == 1


def test_nothing_fits_raises_with_the_plan_as_the_command_fails():
    with pytest.raises(gpumem.NothingFitsError, match="nothing fits") as caught:
        gpumem.fit(model="llama-3-8b", gpu="8GiB", mode="train")
    plan = caught.value.plan
    assert isinstance(caught.value, gpumem.PlanError)
    assert plan.fit is None and plan.advice
    done = cli("plan", "--model", "llama-3-8b", "--gpu", "8GiB", "--fit", "batch", "--mode",
               "train", "--json")
    assert done.returncode == 2 and str(caught.value) in done.stderr
    assert json.loads(done.stdout) == plan.to_dict()


def test_bad_arguments_raise_typed_errors_naming_what_is_accepted():
    with pytest.raises(gpumem.PlanError, match="no-such-model"):
        gpumem.plan(model="no-such-model")
    with pytest.raises(gpumem.PlanError, match=r"unknown plan setting `batchsize`.*batch"):
        gpumem.plan(model="gpt2", batchsize=4)
    with pytest.raises(gpumem.PlanError, match="invalid batch"):
        gpumem.plan(model="gpt2", batch="four")
    with pytest.raises(gpumem.PlanError, match="not both"):
        gpumem.plan(model="gpt2", config="config.json")
    with pytest.raises(AttributeError, match="peak_total_byte"):
        gpumem.plan(model="gpt2", reserved="estimate").peak_total_byte  # noqa: B018
    with pytest.raises(gpumem.ReplayError, match="accepted: one of none, torch"):
        gpumem.replay(SMALL, policies="no-such-policy")
    with pytest.raises(gpumem.ReplayError, match="percentage"):
        gpumem.replay(SMALL, capacity="50%")
    with pytest.raises(gpumem.ReplayError, match="max_replays 1: accepted: 2 to 100000"):
        gpumem.tune(SMALL, max_replays=1)
    with pytest.raises(gpumem.ReplayError, match="top 0: accepted: 1 to 100"):
        gpumem.tune(SMALL, top=0)


def test_request_values_are_checked_in_process():
    """plan() checks the request's own values as the command does, used or not: a margin out of
    range without a fit, a context past 1 TiB, a global batch of 0 (the command alone did)."""
    for settings, message in [(dict(margin=1.5), r"invalid margin = 1\.5"),
                              (dict(context_mib=2**40), "invalid context-mib"),
                              (dict(global_batch=0), "invalid global-batch = 0")]:
        with pytest.raises(gpumem.PlanError, match=message):
            gpumem.plan(model="gpt2", **settings)


def test_replay_of_a_file_equals_the_command():
    got = gpumem.replay(SMALL, capacity="64MiB")
    want = cli_json("replay", str(SMALL), "--capacity", "64MiB")
    assert without_timings(got.to_dict()) == without_timings(want)
    assert [p.policy for p in got.policies] == ["none", "torch", "expandable", "gpumem"]
    named_twice = gpumem.replay(SMALL, policies=["gpumem", "torch", "torch", "all"])
    assert [p.policy for p in named_twice.policies] == ["gpumem", "torch", "none", "expandable"]
    assert isinstance(got.policies[0], results.PolicyReport)
    assert got.trace.events == want["trace"]["events"] > 0


def test_replay_of_the_bundled_trace_equals_the_command():
    got = gpumem.replay(policies="torch")
    want = cli_json("replay", "--policy", "torch")
    assert without_timings(got.to_dict()) == without_timings(want)


def test_replay_of_bytes_and_of_a_snapshot_dict_equal_the_file():
    from_file = without_timings(gpumem.replay(SNAPSHOT, policies=["torch", "gpumem"]).to_dict())
    from_bytes = gpumem.replay(SNAPSHOT.read_bytes(), policies=["torch", "gpumem"])
    with open(SNAPSHOT, "rb") as f:
        snapshot = pickle.load(f)
    from_dict = gpumem.replay(snapshot, policies=["torch", "gpumem"])
    for got in (from_bytes, from_dict):
        got = without_timings(got.to_dict())
        assert got["trace"].pop("name") == "snapshot"
        want = dict(from_file, trace=dict(from_file["trace"]))
        want["trace"].pop("name")
        assert got == want


def test_a_pickle_that_is_not_a_snapshot_is_a_trace_error(tmp_path):
    with pytest.raises(gpumem.TraceError, match="not a PyTorch memory snapshot"):
        gpumem.replay(pickle.dumps({"a": 1}))
    path = tmp_path / "f.pickle"
    path.write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(gpumem.TraceError) as caught:
        gpumem.replay(path)
    assert str(caught.value).count(str(path)) == 1


def test_tune_equals_the_command():
    got = gpumem.tune(SMALL, max_replays=8, top=2)
    want = cli_json("tune", str(SMALL), "--max-replays", "8", "--top", "2")
    assert without_timings(got.to_dict()) == without_timings(want)
    assert isinstance(got.tune.pytorch_default, results.Tuned)
    assert len(got.tune.ranked) <= 2


def test_report_returns_or_writes_the_page(tmp_path):
    page = gpumem.report(SMALL, policies="torch")
    assert page.lower().startswith("<!doctype html>") and "small-gpt2-2l-infer-b1-s32" in page
    out = tmp_path / "report.html"
    assert gpumem.report([SMALL], out, policies="torch") == os.fspath(out)
    assert out.read_text(encoding="utf-8").lower().startswith("<!doctype html>")


def test_policies_devices_and_selftest_equal_the_command():
    assert [p.to_dict() for p in gpumem.policies()] == cli_json("policies")
    assert [p.name for p in gpumem.policies() if p.default] == ["expandable"]
    listed = gpumem.devices()
    sim = [d for d in listed.devices if d.backend == "sim"]
    assert [d.to_dict() for d in sim] == [
        d for d in cli_json("devices")["devices"] if d["backend"] == "sim"]
    checked = gpumem.selftest(policies="torch")
    assert checked.passed and checked.reports[0].policy == "torch"
    want = cli_json("selftest", "--policy", "torch")
    assert without_timings(checked.to_dict()) == without_timings(want)


def test_the_package_runs_no_subprocess_and_shows_only_its_api():
    package = pathlib.Path(gpumem.__file__).parent
    for source in package.glob("*.py"):
        assert "subprocess" not in source.read_text(encoding="utf-8"), source.name
    # In a fresh interpreter: other tests here import gpumem.torch and friends.
    shown = subprocess.run(
        [sys.executable, "-c",
         "import gpumem; print(' '.join(n for n in dir(gpumem) if not n.startswith('_')))"],
        capture_output=True, text=True, check=True).stdout.split()
    assert set(shown) == set(gpumem.__all__)


def test_python_m_gpumem_runs_the_command():
    done = subprocess.run([sys.executable, "-m", "gpumem", "policies"], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0
    assert done.stdout.split()[0] == "none"
    bad = subprocess.run([sys.executable, "-m", "gpumem", "replay", "/no/such/trace"],
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and bad.stderr.count("/no/such/trace") == 1
    live = subprocess.run([sys.executable, "-m", "gpumem", "top"], capture_output=True,
                          text=True, check=False)
    assert live.returncode == 2 and "not in this build" in live.stderr
