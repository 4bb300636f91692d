"""Argument types and error reporting shared by the three commands (no PyTorch needed)."""

import argparse
import re
import sys

_DEVICE = re.compile(r"(cpu|cuda(:[0-9]+)?)")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def probability(text: str) -> float:
    """argparse type: a number in [0, 1) (a dropout probability)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be at least 0 and below 1, not {value}")
    return value


def regex(text: str) -> re.Pattern[str]:
    """argparse type: a regular expression (Python `re` syntax)."""
    try:
        return re.compile(text)
    except re.error as err:
        raise argparse.ArgumentTypeError(
            f"not a valid regular expression: {text!r} ({err})") from None


def device(text: str) -> str:
    """argparse type: `cpu`, `cuda` or `cuda:N`."""
    if not _DEVICE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, not {text!r}")
    return text


def device_type(name: str) -> str:
    """`cpu` or `cuda`, as torch.device(name).type (for names `device` accepts)."""
    return name.partition(":")[0]


#: The exit status of a command that needs a CUDA device and finds none: nothing was measured
#: (77, which scripts/gpu-check.sh and automake read as "skipped").
NO_DEVICE = 77


def fail(prog: str, message: object) -> int:
    """Print `prog: error: message` to stderr; the exit status for a failed run (1)."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 1
