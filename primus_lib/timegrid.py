"""Instants and the window grid: the one place that parses UTC instants and does window arithmetic.

Every instant primus handles is an aware ``datetime`` in UTC, and a plain one: pendulum's
subclass (what Airflow hands out) refuses arithmetic that mixes it with plain datetimes.
Windows are fixed-size intervals ``[t, t + size)`` (``1h`` or ``1d``) on a grid anchored at an
origin, the spec's ``timer.start``. The spec checks keep ``timer.start`` on a UTC boundary of
the size, so a job's grid is also the epoch-aligned one event times fall on
(``epoch_ms(t) // size_ms``). Stdlib only: the spec models, the Airflow timetable (parsed
with every DAG) and the trainer all import it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

WINDOW_SIZES: dict[str, timedelta] = {"1h": timedelta(hours=1), "1d": timedelta(days=1)}
ISO_EXAMPLE = "2026-11-01T00:00:00Z"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # the origin of UTC boundaries (whole hours, days)
_MS = timedelta(milliseconds=1)


def window_size(name: str) -> timedelta:
    """The length of a window named in a spec (``1h``, ``1d``)."""
    try:
        return WINDOW_SIZES[name]
    except KeyError:
        raise ValueError(f"window: expected one of {sorted(WINDOW_SIZES)}, found {name!r}") from None


# --- instants -------------------------------------------------------------------------------
def parse_utc(text: str, what: str = "instant", *, assume_utc: bool = True) -> datetime:
    """An ISO-8601 instant (``Z`` or an offset) as UTC. A naive one is taken as UTC unless
    ``assume_utc`` is false; errors name ``what`` (a CLI flag or a field)."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{what}: expected an ISO instant like {ISO_EXAMPLE}, got {text!r}") from None
    return as_utc(value, what, assume_utc=assume_utc)


def as_utc(value: datetime | str, what: str = "instant", *, assume_utc: bool = True) -> datetime:
    """``value`` (a datetime, pendulum's included, or an ISO string) as a plain UTC datetime."""
    if isinstance(value, str):
        return parse_utc(value, what, assume_utc=assume_utc)
    if value.tzinfo is None:
        if not assume_utc:
            raise ValueError(f"{what}: expected a timezone-aware instant, found {value!r}")
        value = value.replace(tzinfo=UTC)
    utc = value.astimezone(UTC)
    return datetime(utc.year, utc.month, utc.day, utc.hour, utc.minute, utc.second, utc.microsecond, tzinfo=UTC)


def iso(instant: datetime) -> str:
    """``YYYY-MM-DDTHH:MM:SSZ``: how primus prints an instant (CLI output, errors, Airflow requests)."""
    return as_utc(instant).strftime("%Y-%m-%dT%H:%M:%SZ")


def epoch_ms(instant: datetime) -> int:
    """Milliseconds since the epoch (floored): the unit of the sample schema's timestamp column.
    Integer arithmetic: ``int(t.timestamp() * 1000)`` is off by one for some instants (1.001 s)."""
    return (instant - EPOCH) // _MS


def from_epoch_ms(ms: int) -> datetime:
    return EPOCH + ms * _MS


# --- the grid -------------------------------------------------------------------------------
def floor(instant: datetime, size: timedelta, origin: datetime) -> datetime:
    """Start of the window that contains ``instant``."""
    return origin + ((instant - origin) // size) * size


def ceil(instant: datetime, size: timedelta, origin: datetime) -> datetime:
    """Start of the first window that starts at or after ``instant``."""
    start = floor(instant, size, origin)
    return start if start == instant else start + size


def on_grid(instant: datetime, size: timedelta, origin: datetime) -> bool:
    return (instant - origin) % size == timedelta(0)


def window_starts(first: datetime, stop: datetime | None, size: timedelta, origin: datetime) -> Iterator[datetime]:
    """Starts of the windows that start in ``[first, stop)``; without ``stop`` the iterator never
    ends (the consumer decides how far to go, e.g. up to the last window whose data is ready)."""
    current = ceil(first, size, origin)
    while stop is None or current < stop:
        yield current
        current += size
