"""Checks of the arguments the public functions pass on to the extension, so that a bad one is
an error naming the argument and what is accepted, not an unnamed OverflowError from the
conversion to an unsigned integer."""

from __future__ import annotations

from typing import Any


def whole(name: str, value: Any, error: type[Exception] = ValueError) -> Any:
    """``value`` of the argument ``name`` when it is None or a whole number, 0 or more; else
    ``error`` (a bool is not a number here, though Python counts it as one)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} {value!r}: accepted: a whole number, 0 or more")
    if value < 0:
        raise error(f"{name} {value}: accepted: a whole number, 0 or more")
    return value
