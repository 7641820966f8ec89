"""The trainer's prefetch thread: reads the feeds into the staging buffers in the background,
so that training never waits on input it could have had (Arrow reads, Kafka polls and SQLite
release the GIL)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from primus_lib.train.trainer import Trainer


class Prefetcher:
    """Calls ``trainer.read_inputs()`` under ``trainer.lock`` until stopped; a failure is kept
    and raised in the training thread by ``check()`` (and by ``stop()``)."""

    def __init__(self, trainer: Trainer):
        self.trainer = trainer
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="primus-prefetch", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        trainer = self.trainer
        try:
            while not self.stopping.is_set():
                with trainer.lock:
                    arrived = trainer.read_inputs()
                if not arrived:  # nothing new (or buffers full): back off, never spin
                    self.stopping.wait(max(0.002, min(trainer.options.poll_interval, 0.02)))
        except BaseException as exc:  # surfaced in the training thread by check()
            self.error = exc

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"prefetch thread failed: {self.error}") from self.error

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=30)
        self.check()
