"""Wait in the triggerer until the trainer's checkpoint says it consumed a window.

The file is read through ``primus_lib.progress``, the one module that knows its format. On
remote storage the trigger carries only the storage connection's id (its kwargs are stored in
Airflow's database): the triggerer resolves the connection itself (``BaseHook.aget_connection``)
and reads with those credentials on an explicit filesystem, never through ``os.environ`` (one
triggerer process runs the triggers of every job).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from primus_lib.progress import consumed_metrics, missing, read_progress

log = logging.getLogger(__name__)

# The operator checked just before deferring. Firing soon after can beat the scheduler to the
# deferring process's exit event, which Airflow 3.3 then reads as "task state changed
# externally" and fails the resumed try (apache/airflow#71580, #72716; seen here with the
# LocalExecutor on 2 busy cores with a 5 s wait). Waiting 15 s first keeps clear of that race.
FIRST_CHECK_AFTER = 15.0


class TrainerProgressTrigger(BaseTrigger):
    """Polls the progress file until every window in ``keys`` is consumed (or ``timeout`` passes).

    With ``spec_path`` it also reads the job's status from its resource backend on every poll, and
    ends with the job's error as soon as the job has failed (a failed trainer never consumes the
    window). A status that cannot be read is logged and the wait goes on.

    Yields exactly one event: ``{"status": "success"|"timeout"|"error", "message": str,
    "windows": {key: {"samples", "auc", "logloss", "at"}}}``.
    """

    def __init__(
        self,
        progress_path: str,
        keys: list[str],
        poll_interval: float = 10.0,
        timeout: float = 6 * 3600.0,
        first_check_after: float = FIRST_CHECK_AFTER,
        spec_path: str | None = None,
        connection_id: str | None = None,
    ):
        super().__init__()
        self.spec_path = spec_path
        self.connection_id = connection_id
        self.first_check_after = first_check_after
        self.progress_path = progress_path
        self.keys = list(keys)
        self.poll_interval = poll_interval
        self.timeout = timeout

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "progress_path": self.progress_path,
                "keys": self.keys,
                "poll_interval": self.poll_interval,
                "timeout": self.timeout,
                "first_check_after": self.first_check_after,
                "spec_path": self.spec_path,
                "connection_id": self.connection_id,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        deadline = time.monotonic() + self.timeout
        await asyncio.sleep(min(self.first_check_after, self.timeout))
        try:
            where = await self._location()
        except Exception as exc:
            yield TriggerEvent({"status": "error", "message": f"{self.progress_path}: {exc}", "windows": {}})
            return
        while True:
            try:
                progress = await asyncio.to_thread(read_progress, where)
            except Exception as exc:
                yield TriggerEvent({"status": "error", "message": f"{self.progress_path}: {exc}", "windows": {}})
                return
            metrics = consumed_metrics(progress, self.keys)
            if metrics is not None:
                yield TriggerEvent(
                    {"status": "success", "message": f"trainer consumed {', '.join(self.keys)}", "windows": metrics}
                )
                return
            failure = await self._job_failure()
            if failure is not None:
                yield TriggerEvent({"status": "error", "message": f"trainer job failed: {failure}", "windows": {}})
                return
            if time.monotonic() >= deadline:
                yield TriggerEvent(
                    {
                        "status": "timeout",
                        "message": f"trainer did not consume {', '.join(missing(progress, self.keys))} within "
                        f"{self.timeout:.0f}s "
                        f"(progress file {self.progress_path}, step {progress.get('step')})",
                        "windows": {},
                    }
                )
                return
            await asyncio.sleep(min(self.poll_interval, max(0.0, deadline - time.monotonic())))

    async def _location(self) -> Any:
        """The progress file, on a remote store with the connection's credentials (resolved here,
        in the triggerer, never through the environment), else the path."""
        if not self.connection_id or "://" not in str(self.progress_path):
            return self.progress_path
        from primus_lib.storage import locate
        from primus_operators.hooks.storage import PrimusStorageHook

        credentials = await PrimusStorageHook(self.connection_id).acredentials()
        return await asyncio.to_thread(locate, self.progress_path, credentials)

    async def _job_failure(self) -> str | None:
        if not self.spec_path:
            return None
        from primus_lib.resources import job_failure

        try:
            return await asyncio.to_thread(job_failure, self.spec_path)
        except Exception as exc:  # a status we cannot read is no verdict: keep waiting on progress
            log.warning("cannot read the job status of %s: %s", self.spec_path, exc)
            return None
