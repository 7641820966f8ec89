"""Waiting on a condition, never on the clock: tests run on loaded 2-core machines, so a wait is
a poll with a generous bound, and the assertion is checked on what the poll saw."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(what: str, check: Callable[[], T], timeout: float = 60.0, interval: float = 0.1) -> T:
    """Poll ``check()`` until it returns something truthy (and return that); fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f}s: {what} (last: {last!r})")
        time.sleep(interval)
