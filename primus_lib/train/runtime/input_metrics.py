"""The trainer's input signals for the Dynamic Scaling Manager: the share of loop time spent
waiting for data (starved: more data executors would help) and the share during which its
read-ahead queues were full (back-pressure: the trainer is the bottleneck, adding executors
would not help). Accumulated per loop iteration (a few float additions), published as
``TrainerMetrics`` and snapshotted into the job's metrics dir every few seconds and at
checkpoints, by a background thread (``SnapshotWriter.write_later``); any metrics failure is
logged and ignored."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from primus_lib.metrics.instruments import TrainerMetrics
from primus_lib.metrics.reporting import SNAPSHOT_EVERY_SECONDS, SnapshotWriter, guarded, serve_from_env, snapshot_name
from primus_lib.storage import Where


class InputMetrics:
    """One trainer rank's starved / back-pressure ratios over each reporting interval."""

    def __init__(
        self,
        job_name: str,
        rank: int,
        registry: CollectorRegistry,
        metrics_dir: Where,
        queues_full: Callable[[], bool],
        every: float | None = None,
    ) -> None:
        self.metrics = TrainerMetrics(job_name, str(rank), registry=registry)
        every = every if every is not None else SNAPSHOT_EVERY_SECONDS
        self.writer = SnapshotWriter(metrics_dir, snapshot_name("trainer", rank), registry, every)
        self.queues_full = queues_full  # every live buffer holds its read-ahead (Inputs.queues_full)
        self.wait = self.total = self.full = 0.0
        self.samples = 0  # trained since the last publish (a counter's inc takes its lock: not per step)
        self.started = time.perf_counter()
        serve_from_env(registry, offset=_local_rank())

    def begin(self) -> float:
        """Start of a loop iteration; returns its start time."""
        self.started = time.perf_counter()
        return self.started

    def end(self, began: float, fed: float, trained: bool, full: bool, live: bool = False) -> None:
        """End of a loop iteration that began at ``began`` and finished bringing data in at ``fed``.
        Time before ``fed`` is input wait when a step followed; a whole iteration without a step is,
        unless the stream is ``live`` (every stream source at its live edge): then no executor has
        data to give, more executors would not help, and the iteration is not counted at all."""
        now = time.perf_counter()
        total = now - began
        if live and not trained:
            return
        self.total += total
        self.wait += (fed - began) if trained else total
        if full:
            self.full += total
        if self.writer.due():
            self.publish()

    def add_samples(self, rows: int) -> None:
        self.samples += rows

    def publish(self, last: bool = False) -> None:
        """Set the gauges from the interval's sums, reset them, write the snapshot (in the
        background; ``last``: now, and the background thread stops)."""
        if self.total > 0:
            wait, total, full = self.wait, self.total, self.full
            guarded("trainer gauges", lambda: self.metrics.observe_step(wait, total, full))
        if self.samples:
            samples = self.samples
            guarded("trainer samples", lambda: self.metrics.samples.inc(samples))
        self.wait = self.total = self.full = 0.0
        self.samples = 0
        if last:
            self.writer.close()
            self.writer.write()
        else:
            self.writer.write_later()

    def close(self) -> None:
        """Stop the background writer (a trainer that failed: no last snapshot)."""
        self.writer.close()


def _local_rank() -> int:
    from primus_lib.settings import settings

    return settings().local_rank or 0
