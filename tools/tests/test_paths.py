"""Finding the gpumem checkout the commands write into by default."""

from pathlib import Path

import pytest
from conftest import REPO

from gpumem_devtools import paths


def test_the_checkout_is_found_from_inside_it() -> None:
    assert paths.is_repo(REPO)
    assert paths.find_repo(REPO / "crates") == REPO
    assert paths.find_repo(REPO / "testdata" / "traces" / "configs") == REPO


def test_from_another_checkout_that_one_wins(fake_repo: Path) -> None:
    (fake_repo / "sub").mkdir()
    assert paths.find_repo(fake_repo / "sub") == fake_repo.resolve()


def test_explicit_repo_is_checked(fake_repo: Path, tmp_path: Path) -> None:
    assert paths.repo_root(fake_repo) == fake_repo.resolve()
    with pytest.raises(ValueError, match="is not a gpumem checkout"):
        paths.repo_root(tmp_path / "elsewhere")


def test_outside_any_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(paths, "__file__", str(tmp_path / "site" / "paths.py"))
    assert paths.find_repo() is None
    with pytest.raises(ValueError, match="cannot find the gpumem checkout.*pass --repo"):
        paths.repo_root()
