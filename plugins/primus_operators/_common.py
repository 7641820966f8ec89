"""Small helpers shared by the operators and triggers: spec loading, window instants, the API client."""

from __future__ import annotations

import os
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from primus_lib.naming import WINDOW_PARAM
from primus_lib.timegrid import as_utc, iso, on_grid

if TYPE_CHECKING:
    from primus_lib.airflow_api import AirflowApi
    from primus_lib.spec import PrimusJob


def load_spec(spec_path: str) -> PrimusJob:
    """The validated job of ``spec_path`` (cached per file version, re-read when it changes)."""
    return _load(os.path.abspath(spec_path), os.stat(spec_path).st_mtime_ns)


@lru_cache(maxsize=32)
def _load(path: str, _mtime: int) -> PrimusJob:
    from primus_lib.spec import load_job

    return load_job(path)


def window_of(context: Any, job: PrimusJob | None = None) -> datetime:
    """Start of the run's window: the ``window_start`` param of a manual run, else the data interval start.

    With ``job``, a start that is not on one of the job's window boundaries is refused.
    """
    params = context.get("params") or {}
    start = params.get(WINDOW_PARAM) or context.get("data_interval_start") or context.get("logical_date")
    if start is None:
        raise ValueError("this DAG run has no data interval: trigger it with a logical date inside a window")
    start = as_utc(start, WINDOW_PARAM)  # a naive param is UTC, as on the primus CLI
    if job is not None:
        timer = job.spec.timer
        if not on_grid(start, timer.window_size, timer.start):
            raise ValueError(
                f"window_start: expected the start of a {timer.window} window of job {job.name} "
                f"(from {iso(timer.start)}), found {iso(start)}"
            )
    return start


def airflow_api(conn_id: str) -> AirflowApi | None:
    """The Airflow REST client of an http connection (host/port, login/password), or None when
    no such connection exists: tasks reach pools and notes only through the API server."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    from primus_lib.airflow_api import AirflowApi

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None
    base = f"{conn.schema or 'http'}://{conn.host}" + (f":{conn.port}" if conn.port else "")
    return AirflowApi(base, conn.login or "admin", conn.password)
