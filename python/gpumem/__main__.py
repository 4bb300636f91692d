"""``python -m gpumem ARGS``: the ``gpumem`` command (plan, replay, tune, policies, devices,
selftest), run in-process from the extension module."""

from __future__ import annotations

import sys


def main() -> int:
    """Runs the command with this process's arguments; returns its exit status."""
    from gpumem._gpumem import cli

    return cli(["gpumem", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
