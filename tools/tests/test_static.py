"""Static checks of the package's sources, which the tests without PyTorch cannot import: a
name used but defined nowhere (such as a helper lost in a merge) fails here rather than when
a measurement reaches it on a machine with PyTorch."""

from pathlib import Path

from pyflakes.api import checkPath
from pyflakes.reporter import Reporter

TOOLS = Path(__file__).resolve().parents[1]


class _Collect(Reporter):
    """Keeps pyflakes' messages instead of printing them."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def unexpectedError(self, filename: str, msg: str) -> None:  # noqa: N802 - pyflakes API
        self.messages.append(f"{filename}: {msg}")

    def syntaxError(self, filename: str, msg: str, lineno: int, offset: int,  # noqa: N802
                    text: str) -> None:
        self.messages.append(f"{filename}:{lineno}: {msg}")

    def flake(self, message: object) -> None:
        self.messages.append(str(message))


def test_sources_have_no_undefined_or_unused_names() -> None:
    sources = sorted((TOOLS / "src").rglob("*.py")) + sorted((TOOLS / "tests").rglob("*.py"))
    assert len(sources) > 10
    reporter = _Collect()
    for path in sources:
        checkPath(str(path), reporter)
    assert reporter.messages == []
