"""The Timer operator: the time windows of a stream, endless for an open-ended range."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

from primus_lib.spec.job import PrimusJob


def align(when: datetime, size: timedelta, origin: datetime) -> datetime:
    """The start of the window containing ``when``."""
    return origin + ((when - origin) // size) * size


def windows(job: PrimusJob, start: datetime | None = None, end: datetime | None = None) -> Iterator[datetime]:
    """Window starts from ``start`` (default: the timer's start) until ``end`` (exclusive).

    With neither ``end`` nor ``timer.end`` the generator never ends: the consumer decides how
    far to go (for example up to the last window whose data is ready).
    """
    timer = job.spec.timer
    size = timer.window_size
    first = align(max(start or timer.start, timer.start), size, timer.start)
    if first < (start or timer.start):
        first += size
    stop = min(t for t in (end, timer.end) if t is not None) if (end or timer.end) else None
    current = first
    while stop is None or current < stop:
        yield current
        current += size
