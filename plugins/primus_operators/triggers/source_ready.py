"""Wait in the triggerer until a source's partition for a window is complete."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from primus_operators.triggers.trainer_progress import FIRST_CHECK_AFTER

if TYPE_CHECKING:
    from primus_lib.filesystems import StorageCredentials
    from primus_lib.spec import PrimusJob


class SourceReadyTrigger(BaseTrigger):
    """Polls ``primus_lib.data.dtgg.source_ready`` until true, or gives up after ``timeout``.

    The source's ``connection_id`` is resolved here, before each check, and its credentials are
    handed to the filesystem: the triggerer serves every job, so its environment holds none of
    theirs, and nothing is written to it.

    Yields exactly one event: ``{"status": "success"|"timeout"|"error", "message": str}``.
    """

    def __init__(
        self,
        spec_path: str,
        stream: str,
        source: str,
        window_start: str,
        poll_interval: float = 30.0,
        timeout: float = 6 * 3600.0,
        first_check_after: float = FIRST_CHECK_AFTER,
    ):
        super().__init__()
        self.first_check_after = first_check_after
        self.spec_path = spec_path
        self.stream = stream
        self.source = source
        self.window_start = window_start
        self.poll_interval = poll_interval
        self.timeout = timeout

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "spec_path": self.spec_path,
                "stream": self.stream,
                "source": self.source,
                "window_start": self.window_start,
                "poll_interval": self.poll_interval,
                "timeout": self.timeout,
                "first_check_after": self.first_check_after,
            },
        )

    async def _check(self) -> tuple[bool, str]:
        from primus_lib.timegrid import as_utc
        from primus_operators._common import load_spec
        from primus_operators.operators.source import readiness

        job = await asyncio.to_thread(load_spec, self.spec_path)
        credentials = await self._credentials(job)
        start = as_utc(self.window_start)
        return await asyncio.to_thread(readiness, job, self.stream, self.source, start, credentials)

    async def _credentials(self, job: PrimusJob) -> dict[str, StorageCredentials]:
        """The source's connection as credentials (none without a ``connection_id``)."""
        from primus_lib.data.sources.files import find_source
        from primus_operators.hooks.storage import PrimusStorageHook

        conn_id = find_source(job, self.stream, self.source)[1].connection_id
        return {conn_id: await PrimusStorageHook(conn_id).acredentials()} if conn_id else {}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        deadline = time.monotonic() + self.timeout
        where = f"{self.stream}/{self.source} window {self.window_start}"
        await asyncio.sleep(min(self.first_check_after, self.timeout))
        while True:
            try:
                ready, path = await self._check()
            except Exception as exc:  # the spec or the storage is broken: report, do not spin
                yield TriggerEvent({"status": "error", "message": f"{where}: {type(exc).__name__}: {exc}"})
                return
            if ready:
                yield TriggerEvent({"status": "success", "message": f"{where}: partition complete"})
                return
            if time.monotonic() >= deadline:
                yield TriggerEvent(
                    {
                        "status": "timeout",
                        "message": f"{where}: partition not complete after {self.timeout:.0f}s; missing {path}",
                    }
                )
                return
            await asyncio.sleep(min(self.poll_interval, max(0.0, deadline - time.monotonic())))
