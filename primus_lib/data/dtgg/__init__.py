"""DTGG, the data task graph generator: plans batch windows into data tasks.

The per-window calls the Airflow operators make live here; the chunked planner is
:class:`~primus_lib.data.dtgg.planner.Planner`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from primus_lib.data.dtgg.ops import PartitionNotReady, WindowPlan
from primus_lib.data.dtgg.planner import Planner
from primus_lib.data.task import DataTask
from primus_lib.filesystems import StorageCredentials
from primus_lib.paths import window_id
from primus_lib.spec.job import PrimusJob

__all__ = ["DataTask", "PartitionNotReady", "Planner", "WindowPlan", "plan_source", "source_ready"]


def source_ready(
    job: PrimusJob,
    stream: str,
    source: str,
    window_start: datetime,
    credentials: Mapping[str, StorageCredentials] | None = None,
) -> tuple[bool, str | None]:
    """Whether one source's partition of a window is complete; if not, what is missing.
    ``credentials``: by connection id, as for :class:`Planner`."""
    planner = Planner(job, stream, threads=1, credentials=credentials)
    if planner.ledger is not None and planner.ledger.planned(stream, window_id(window_start)):
        return True, None
    op = _op(planner, source)
    listing = planner.lister.list(op.location.fs, {op.partition(window_start).directory})
    result = op.run(window_start, listing, planner.now or datetime.now(UTC))
    return result.missing is None, result.missing


def plan_source(job: PrimusJob, stream: str, source: str, window_start: datetime) -> list[DataTask]:
    """The data tasks of one source in one window (cached in the ledger once the window is complete).

    Raises PartitionNotReady if this source's partition is not complete.
    """
    planner = Planner(job, stream, threads=1)
    _op(planner, source)
    plan = planner.plan_window(window_start)
    if not plan.ready:
        own = [m for m in plan.missing if m.startswith(f"source {source!r}")]
        if own:
            raise PartitionNotReady("; ".join(own))
    return plan.by_source(source)


def _op(planner: Planner, source: str):
    for op in planner.ops:
        if op.source.name == source:
            return op
    raise KeyError(f"stream {planner.stream.name!r} has no source {source!r}")
