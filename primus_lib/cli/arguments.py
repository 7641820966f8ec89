"""Refusing a command's bad arguments in one line, exit 2, before anything runs (instead of a
traceback or a run that does nothing): argparse types for counts and durations (``primus train:
error: argument --max-steps: expected an integer >= 1, got '-1'``), and a name the spec lacks."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Iterable


def integer(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An integer in ``[minimum, maximum]``."""
    wanted = f"an integer >= {minimum}" if maximum is None else f"an integer from {minimum} to {maximum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
        return value

    return parse


def duration(*, zero: bool) -> Callable[[str], float]:
    """A finite number of seconds, above zero (or at least zero with ``zero``)."""
    wanted = "a number of seconds >= 0" if zero else "a number of seconds > 0"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
        return value

    return parse


def refuse_choice(command: str, flag: str, expected: str, choices: Iterable[str], got: str) -> int:
    """``flag`` names none of ``choices`` (read from the spec, so argparse cannot list them)."""
    print(f"primus {command}: {flag}: expected {expected} ({', '.join(choices)}), got {got!r}", file=sys.stderr)
    return 2
