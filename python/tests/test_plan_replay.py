"""gpumem.plan / fit / replay give the command's JSON: compared with the gpumem binary
(GPUMEM_CLI, as scripts/test-python.sh passes it) or else `python -m gpumem`."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest

import gpumem
from conftest import TRACES

SMALL = TRACES / "small-gpt2-2l-infer-b1-s32.jsonl.gz"
SNAPSHOT = TRACES / "small-gpt2-2l-infer-b1-s32.snapshot.p4.pickle"


def cli_json(*args: str) -> dict:
    binary = os.environ.get("GPUMEM_CLI")
    head = [binary] if binary else [sys.executable, "-m", "gpumem"]
    done = subprocess.run([*head, *args, "--json"], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def without_timings(report: dict) -> dict:
    for policy in report["policies"]:
        policy.pop("events_per_second", None)
        policy.pop("seconds", None)
    return report


def test_plan_equals_the_command():
    got = gpumem.plan(model="gpt2", mode="train", batch=4, seq=512, amp="bf16", grad_ckpt=True,
                      gpu="rtx-4090")
    assert got == cli_json("plan", "--model", "gpt2", "--mode", "train", "--batch", "4",
                           "--seq", "512", "--amp", "bf16", "--grad-ckpt", "--gpu", "rtx-4090")
    assert got.peak_total_bytes == got["peak_total_bytes"] > 0
    assert got.gpu.fits in (True, False)


def test_fit_finds_a_batch_and_equals_the_command():
    got = gpumem.fit(model="gpt2", gpu="24GiB", mode="train", seq=1024)
    assert got == cli_json("plan", "--model", "gpt2", "--gpu", "24GiB", "--fit", "batch",
                           "--mode", "train", "--seq", "1024")
    assert got.fit.target == "batch" and got.fit.value >= 1


def test_a_bad_argument_raises_with_the_commands_message():
    with pytest.raises(gpumem.GpumemError, match="no-such-model"):
        gpumem.plan(model="no-such-model")
    with pytest.raises(AttributeError, match="peak_total_bytes"):
        gpumem.plan(model="gpt2").peak_total_byte


def test_replay_of_a_file_equals_the_command():
    got = gpumem.replay(SMALL, capacity="64MiB")
    want = cli_json("replay", str(SMALL), "--capacity", "64MiB")
    assert without_timings(got) == without_timings(want)
    assert [p.policy for p in got.policies] == ["none", "torch", "expandable", "gpumem"]


def test_replay_of_a_snapshot_dict_equals_the_command_on_its_file():
    with open(SNAPSHOT, "rb") as f:
        snapshot = pickle.load(f)
    got = gpumem.replay(snapshot, policies=["torch", "gpumem"])
    want = cli_json("replay", str(SNAPSHOT), "--format", "pytorch", "--policy", "torch")
    want["policies"] += cli_json("replay", str(SNAPSHOT), "--format", "pytorch",
                                 "--policy", "gpumem")["policies"]
    got, want = without_timings(got), without_timings(want)
    got["trace"].pop("name"), want["trace"].pop("name")  # the temporary file's name
    assert got == want


def test_python_m_gpumem_runs_the_command():
    done = subprocess.run([sys.executable, "-m", "gpumem", "policies"], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0
    assert done.stdout.split()[0] == "none"
    bad = subprocess.run([sys.executable, "-m", "gpumem", "replay", "/no/such/trace"],
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "/no/such/trace" in bad.stderr
