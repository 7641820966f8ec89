"""DataSource operator: wait for a source's partition of the window, then plan its data tasks."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from primus_lib.credentials import using
from primus_operators._common import load_spec, window_of
from primus_operators.hooks.connections import airflow_resolver
from primus_operators.triggers.source_ready import SourceReadyTrigger

if TYPE_CHECKING:
    from collections.abc import Mapping

    from primus_lib.filesystems import StorageCredentials
    from primus_lib.spec import PrimusJob


def readiness(
    job: PrimusJob,
    stream: str,
    source: str,
    window_start: datetime,
    credentials: Mapping[str, StorageCredentials] | None = None,
) -> tuple[bool, str]:
    """(ready, what is missing or where the partition is), from the planner, for messages;
    ``credentials`` by connection id (else the process environment's)."""
    from primus_lib.data import dtgg

    ready, missing = dtgg.source_ready(job, stream, source, window_start, credentials)
    return bool(ready), missing or f"{stream}/{source} partition of {window_start.isoformat()}"


class PrimusDataSourceOperator(BaseOperator):
    """Waits (deferred, no worker slot) for the window's partition of one batch source, then plans it.

    Returns the planned data tasks through XCom, packed into units (``dtgg.packing``: about 128 MiB
    each, at least one per data executor, at most ``[core] max_map_length``), each a list of
    ``DataTask.to_dict``; the mapped data tasks expand over the units. Sources sharing a path prefix
    share the planner's cached listing.

    :param spec_path: the PrimusJob spec file (templated).
    :param timeout: seconds to wait for the partition before failing with the missing path.
    """

    template_fields = ("spec_path",)
    ui_color = "#d8ecf3"

    def __init__(
        self,
        *,
        spec_path: str,
        stream: str,
        source: str,
        deferrable: bool = True,
        poll_interval: float = 30.0,
        timeout: float = 6 * 3600.0,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.spec_path = spec_path
        self.stream = stream
        self.source = source
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self.timeout = timeout

    def execute(self, context: Any) -> list[list[dict]]:
        job = load_spec(self.spec_path)
        with using(airflow_resolver()):  # the storage's credentials, from the spec's connection_id
            return self._wait_and_plan(job, window_of(context, job))

    def _wait_and_plan(self, job: PrimusJob, start: datetime) -> list[list[dict]]:
        ready, where = readiness(job, self.stream, self.source, start)
        if not ready and self.deferrable:
            self.log.info("not complete yet (%s): deferring", where)
            self.defer(
                trigger=SourceReadyTrigger(
                    spec_path=self.spec_path,
                    stream=self.stream,
                    source=self.source,
                    window_start=start.isoformat(),
                    poll_interval=self.poll_interval,
                    timeout=self.timeout,
                ),
                method_name="execute_complete",
                timeout=timedelta(seconds=self.timeout + 5 * self.poll_interval),
            )
        deadline = time.monotonic() + self.timeout
        while not ready:
            if time.monotonic() >= deadline:
                raise AirflowException(
                    f"{self.stream}/{self.source}: partition not complete after {self.timeout:.0f}s; missing {where}"
                )
            time.sleep(self.poll_interval)
            ready, where = readiness(job, self.stream, self.source, start)
        return self._plan(job, start)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> list[list[dict]]:
        if event.get("status") != "success":
            raise AirflowException(event.get("message", f"source trigger failed: {event!r}"))
        self.log.info("%s", event.get("message"))
        job = load_spec(self.spec_path)
        with using(airflow_resolver()):
            return self._plan(job, window_of(context, job))

    def _plan(self, job: PrimusJob, start: datetime) -> list[list[dict]]:
        from airflow.sdk.configuration import conf

        from primus_lib.data import dtgg
        from primus_lib.data.dtgg.packing import pack
        from primus_lib.scaling.store import role_replicas

        tasks = dtgg.plan_source(job, self.stream, self.source, start)
        slots = role_replicas(job, "data_executor")  # the pool's slots: the batch executors now
        units = pack(tasks, slots, limit=conf.getint("core", "max_map_length", fallback=1024))
        self.log.info(
            "%s/%s window %s: %d data tasks in %d units (%d executors)",
            self.stream,
            self.source,
            start.isoformat(),
            len(tasks),
            len(units),
            slots,
        )
        return [[task.to_dict() for task in unit] for unit in units]
