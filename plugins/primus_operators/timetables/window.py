"""The DTGG Timer as an Airflow Timetable: one DAG run per training window.

A run's data interval is exactly the window ``[t, t + window)``; the run may start once the
window's batch data is complete, ``lag`` after the window's end (``run_after``). Windows are
aligned to the spec's ``timer.start`` and stop before ``timer.end``; the arithmetic is
``primus_lib.timegrid``'s.

Runs are named after their window (``generate_run_id``): ``scheduled__window_2026-11-01T02:00Z``
for the window 02:00-03:00, while Airflow labels a run with its ``run_after`` (03:00 + lag), so
the grid's tooltip ("Run ID") says which window a run trains.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pendulum
from airflow.timetables.base import DagRunInfo, DataInterval, TimeRestriction, Timetable
from airflow.utils.types import DagRunType

from primus_lib import timegrid


def _utc(value: datetime | str) -> datetime:
    """A plain UTC datetime; a naive instant is refused (a timetable must not guess the zone)."""
    return timegrid.as_utc(value, assume_utc=False)


def _pendulum(value: datetime) -> pendulum.DateTime:
    return pendulum.instance(value, tz="UTC")


def window_label(start: datetime) -> str:
    """How a run id names its window: its start, to the minute, in UTC (``2026-11-01T02:00Z``)."""
    return f"{_utc(start):%Y-%m-%dT%H:%MZ}"


class PrimusWindowTimetable(Timetable):
    """Fixed-size windows (``1h`` or ``1d``) from ``start`` until ``end`` (exclusive, optional)."""

    periodic = True
    can_be_scheduled = True

    def __init__(self, start: datetime, window: str = "1h", end: datetime | None = None, lag: timedelta = timedelta(0)):
        self.size = timegrid.window_size(window)
        self.start = _utc(start)
        self.end = _utc(end) if end is not None else None
        self.window = window
        self.lag = lag
        self.description = f"Primus {window} windows from {self.start:%Y-%m-%dT%H:%MZ}" + (
            f" to {self.end:%Y-%m-%dT%H:%MZ}" if self.end else " (open-ended)"
        )

    @classmethod
    def from_timer(cls, timer: Any, lag: timedelta = timedelta(0)) -> PrimusWindowTimetable:
        """Build from a ``primus_lib.spec.TimerSpec`` (duck-typed to keep this module light)."""
        return cls(start=timer.start, window=timer.window, end=timer.end, lag=lag)

    @property
    def summary(self) -> str:
        return f"primus {self.window}" + (f" +{int(self.lag.total_seconds())}s lag" if self.lag else "")

    # --- serialization (the scheduler rebuilds the timetable from this) ---------------
    def serialize(self) -> dict[str, Any]:
        return {
            "start": self.start.isoformat(),
            "end": self.end.isoformat() if self.end else None,
            "window": self.window,
            "lag_seconds": self.lag.total_seconds(),
        }

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> PrimusWindowTimetable:
        return cls(
            start=_utc(data["start"]),
            end=_utc(data["end"]) if data.get("end") else None,
            window=data["window"],
            lag=timedelta(seconds=float(data.get("lag_seconds", 0))),
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PrimusWindowTimetable) and self.serialize() == other.serialize()

    def __hash__(self) -> int:
        return hash(tuple(self.serialize().items()))

    # --- window arithmetic -------------------------------------------------------------
    def floor(self, instant: datetime) -> datetime:
        """Start of the window containing ``instant`` (windows are aligned to ``start``)."""
        return timegrid.floor(_utc(instant), self.size, self.start)

    def ceil(self, instant: datetime) -> datetime:
        return timegrid.ceil(_utc(instant), self.size, self.start)

    def _info(self, start: datetime) -> DagRunInfo:
        end = start + self.size
        return DagRunInfo(
            run_after=_pendulum(end + self.lag),
            data_interval=DataInterval(_pendulum(start), _pendulum(end)),
        )

    # --- the Timetable protocol ---------------------------------------------------------
    def generate_run_id(
        self, *, run_type: DagRunType, run_after: datetime, data_interval: DataInterval | None, **extra: Any
    ) -> str:
        """``<type>__window_<start>``; a manual run adds ``_at_<run_after>`` (a window may be re-run
        by hand). Without a data interval (a manual run with no logical date) Airflow's default.

        Airflow 3.3 calls this for scheduled and manual runs (UI, REST, ``airflow dags trigger``);
        its backfill names runs itself (``backfill__<run_after>``, apache/airflow#56374).
        """
        if data_interval is None:
            return super().generate_run_id(
                run_type=run_type, run_after=_pendulum(run_after), data_interval=None, **extra
            )
        suffix = f"window_{window_label(data_interval.start)}"
        if DagRunType(run_type) == DagRunType.MANUAL:
            suffix += f"_at_{_utc(run_after):%Y-%m-%dT%H:%M:%SZ}"
        return DagRunType(run_type).generate_run_id(suffix=suffix)

    def infer_manual_data_interval(self, *, run_after: datetime) -> DataInterval:
        start = self.floor(run_after)
        return DataInterval(_pendulum(start), _pendulum(start + self.size))

    def next_dagrun_info(
        self, *, last_automated_data_interval: DataInterval | None, restriction: TimeRestriction
    ) -> DagRunInfo | None:
        if last_automated_data_interval is not None:
            start = self.ceil(last_automated_data_interval.end)
        else:
            start = self.start
            if restriction.earliest is not None:
                start = max(start, self.ceil(restriction.earliest))
        if not restriction.catchup:
            # Only the newest window whose data is complete (now >= end + lag).
            newest = self.floor(datetime.now(UTC) - self.lag) - self.size
            start = max(start, newest)
        if restriction.latest is not None and start > restriction.latest:
            return None
        if self.end is not None and start + self.size > self.end:
            return None
        return self._info(start)
