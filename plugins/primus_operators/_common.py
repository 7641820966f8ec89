"""Small helpers shared by the operators and triggers: spec loading and window instants."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from primus_lib.spec import PrimusJob


def load_spec(spec_path: str) -> PrimusJob:
    """The validated job of ``spec_path`` (cached per file version, re-read when it changes)."""
    return _load(os.path.abspath(spec_path), os.stat(spec_path).st_mtime_ns)


@lru_cache(maxsize=32)
def _load(path: str, _mtime: int) -> PrimusJob:
    from primus_lib.spec import load_job

    return load_job(path)


def utc(value: Any) -> datetime:
    """A pendulum/datetime/ISO string as a plain ``datetime`` in UTC."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return datetime.fromtimestamp(value.timestamp(), tz=UTC)


def window_of(context: Any, job: PrimusJob | None = None) -> datetime:
    """Start of the run's window: the ``window_start`` param of a manual run, else the data interval start.

    With ``job``, a start that is not on one of the job's window boundaries is refused.
    """
    params = context.get("params") or {}
    start = params.get("window_start") or context.get("data_interval_start") or context.get("logical_date")
    if start is None:
        raise ValueError("this DAG run has no data interval: trigger it with a logical date inside a window")
    start = utc(start)
    if job is not None:
        timer = job.spec.timer
        if (start - timer.start) % timer.window_size:
            raise ValueError(
                f"window_start: expected the start of a {timer.window} window of job {job.name} "
                f"(from {timer.start:%Y-%m-%dT%H:%M:%SZ}), found {start:%Y-%m-%dT%H:%M:%SZ}"
            )
    return start


def pool_name(job_name: str) -> str:
    """The Airflow pool of a job's data executors."""
    return f"primus-{job_name}"


def asset_uri(job_name: str, stream: str) -> str:
    return f"primus://{job_name}/{stream}"
