"""Wait in the triggerer until a source's partition for a window is complete."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from primus_operators.triggers.trainer_progress import FIRST_CHECK_AFTER


class SourceReadyTrigger(BaseTrigger):
    """Polls ``primus_lib.data.dtgg.source_ready`` until true, or gives up after ``timeout``.

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

    def _check(self) -> tuple[bool, str]:
        from primus_lib.timegrid import as_utc
        from primus_operators._common import load_spec
        from primus_operators.operators.source import readiness

        return readiness(load_spec(self.spec_path), self.stream, self.source, as_utc(self.window_start))

    async def run(self) -> AsyncIterator[TriggerEvent]:
        deadline = time.monotonic() + self.timeout
        where = f"{self.stream}/{self.source} window {self.window_start}"
        await asyncio.sleep(min(self.first_check_after, self.timeout))
        while True:
            try:
                ready, path = await asyncio.to_thread(self._check)
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
