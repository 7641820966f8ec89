"""The Timer operator: the time windows of a stream, endless for an open-ended range."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from primus_lib.spec.job import PrimusJob
from primus_lib.timegrid import window_starts


def windows(job: PrimusJob, start: datetime | None = None, end: datetime | None = None) -> Iterator[datetime]:
    """Window starts from ``start`` (default: the timer's start) until ``end`` (exclusive).

    With neither ``end`` nor ``timer.end`` the generator never ends: the consumer decides how
    far to go (for example up to the last window whose data is ready).
    """
    timer = job.spec.timer
    first = max(start or timer.start, timer.start)
    stops = [t for t in (end, timer.end) if t is not None]
    return window_starts(first, min(stops) if stops else None, timer.window_size, timer.start)
