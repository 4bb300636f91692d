"""Shared fixtures. Tests marked `torch` run only with GPUMEM_DEVTOOLS_TORCH_TESTS=1 and
torch, transformers and torchvision importable; everything else needs no PyTorch."""

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO / "testdata" / "traces"
SMALL = TRACES / "small-gpt2-2l-infer-b1-s32"
OPT_IN = "GPUMEM_DEVTOOLS_TORCH_TESTS"
TORCH_PACKAGES = ("torch", "transformers", "torchvision")
# Modules of the package that import torch at import time.
TORCH_MODULES = ("gpumem_devtools.models", "gpumem_devtools.recorder",
                 "gpumem_devtools.workloads")


def _torch_skip_reason() -> str | None:
    if os.environ.get(OPT_IN) != "1":
        return f"needs PyTorch: opt in with {OPT_IN}=1"
    absent = [p for p in TORCH_PACKAGES if importlib.util.find_spec(p) is None]
    if absent:
        return f"{OPT_IN}=1 but not importable: {', '.join(absent)}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _torch_skip_reason()
    if reason is None:
        return
    for item in items:
        if "torch" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def no_torch(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make torch, transformers and torchvision unimportable (whether installed or not)."""
    for name in TORCH_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    for name in TORCH_PACKAGES:
        monkeypatch.setitem(sys.modules, name, None)
    yield


@pytest.fixture
def fake_repo(tmp_path: Path) -> Path:
    """An empty folder laid out as a gpumem checkout (what the commands write into)."""
    root = tmp_path / "checkout"
    (root / "tools").mkdir(parents=True)
    (root / "tools" / "pyproject.toml").write_text("")
    (root / "testdata").mkdir()
    return root


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())
