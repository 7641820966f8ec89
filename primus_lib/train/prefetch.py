"""The trainer's prefetch thread: reads the feeds into the staging buffers in the background,
so that training never waits on input it could have had (Arrow reads, Kafka polls and SQLite
release the GIL)."""

from __future__ import annotations

import threading
from collections.abc import Callable


class Prefetcher:
    """Calls ``read()`` under ``lock`` until stopped; a failure is kept and raised in the
    training thread by ``check()`` (and by ``stop()``)."""

    def __init__(self, read: Callable[[], bool], lock: threading.Lock, poll_interval: float):
        self.read = read
        self.lock = lock
        self.backoff = max(0.002, min(poll_interval, 0.02))
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="primus-prefetch", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stopping.is_set():
                with self.lock:
                    arrived = self.read()
                if not arrived:  # nothing new (or buffers full): back off, never spin
                    self.stopping.wait(self.backoff)
        except BaseException as exc:  # surfaced in the training thread by check()
            self.error = exc

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"prefetch thread failed: {self.error}") from self.error

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=30)
        self.check()
