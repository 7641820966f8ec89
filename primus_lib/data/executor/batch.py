"""Batch data executors: parallel task runners that pull tasks from the ledger until none is left.

Each executor heartbeats; if it dies its running tasks are reclaimed by the ledger (heartbeat
timeout) and redone by another executor. Task outputs are staged atomically and idempotently,
so a redone task yields the same bytes and nothing is counted twice.
"""

from __future__ import annotations

import threading
import traceback
import uuid
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime

from primus_lib.data.executor.join import join_window
from primus_lib.data.executor.sink import sink_window
from primus_lib.data.executor.task import EXECUTOR_ROLE, execute_task
from primus_lib.data.ledger import FAILED, TaskLedger
from primus_lib.data.shards import Manifest
from primus_lib.data.training_queue import QueuedWindow
from primus_lib.paths import JobPaths, window_id
from primus_lib.resources.limits import Limits, enforced
from primus_lib.spec.job import PrimusJob


class TaskFailed(RuntimeError):
    """Tasks of a window failed after all their attempts."""


@dataclass
class RunStats:
    succeeded: int = 0
    failed: int = 0
    rows: int = 0
    errors: list[str] = field(default_factory=list)


class BatchExecutor:
    """One data executor: ``workers`` task runners over the job's ledger."""

    def __init__(
        self,
        job: PrimusJob,
        *,
        workers: int = 2,
        executor_id: str | None = None,
        ledger: TaskLedger | None = None,
        heartbeat_interval: float = 2.0,
    ):
        self.job = job
        self.workers = max(1, workers)
        self.id = executor_id or f"batch-{uuid.uuid4().hex[:8]}"
        self.ledger = ledger or TaskLedger(JobPaths.for_job(job).ledger)
        self.heartbeat_interval = heartbeat_interval
        self._lock = threading.Lock()

    def run(self, stream: str | None = None, window: str | None = None) -> RunStats:
        """Run pending tasks (of one stream/window if given) until none is pending."""
        stats = RunStats()
        stop = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=(stop,), daemon=True, name=f"{self.id}-hb")
        self.ledger.heartbeat(self.id)
        beat.start()
        threads = [
            threading.Thread(target=self._runner, args=(stream, window, stats), name=f"{self.id}-{i}")
            for i in range(self.workers)
        ]
        # one executor, one allotment: its runners' tasks share the thread count and the memory cap
        limits = Limits.for_role(self.job, EXECUTOR_ROLE)
        try:
            with enforced(limits, f"executor {self.id}", watch=False) if limits else nullcontext():
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
        finally:
            stop.set()
            beat.join()
        return stats

    def _runner(self, stream: str | None, window: str | None, stats: RunStats) -> None:
        while True:
            task = self.ledger.claim(self.id, stream, window)
            if task is None:
                return
            try:
                output = execute_task(self.job, task)
            except Exception as exc:
                state = self.ledger.fail(
                    task.id, self.id, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"
                )
                with self._lock:
                    if state == FAILED:
                        stats.failed += 1
                        stats.errors.append(f"{task.id}: {exc}")
                continue
            if self.ledger.succeed(task.id, self.id, output.to_dict()):
                with self._lock:
                    stats.succeeded += 1
                    stats.rows += output.rows

    def _heartbeat(self, stop: threading.Event) -> None:
        while not stop.wait(self.heartbeat_interval):
            self.ledger.heartbeat(self.id)


@dataclass(frozen=True)
class WindowResult:
    manifest: Manifest
    queued: QueuedWindow
    stats: RunStats


def run_window(job: PrimusJob, stream_name: str, window_start: datetime, workers: int = 2) -> WindowResult:
    """Plan, execute, join and sink one batch window without Airflow (CLI, demo, tests)."""
    from primus_lib.data.dtgg.ops import PartitionNotReady
    from primus_lib.data.dtgg.planner import Planner

    planner = Planner(job, stream_name, threads=1)
    plan = planner.plan_window(window_start)
    if not plan.ready:
        raise PartitionNotReady("; ".join(plan.missing))
    wid = window_id(window_start)
    ledger = planner.ledger or TaskLedger(JobPaths.for_job(job).ledger)
    ledger.reclaim_dead()
    stats = BatchExecutor(job, workers=workers, ledger=ledger).run(stream_name, wid)
    failed = [r for r in ledger.records(stream_name, wid) if r.state == FAILED]
    if failed:
        detail = "; ".join(f"{r.task.id}: {(r.error or '').splitlines()[0] if r.error else ''}" for r in failed[:5])
        raise TaskFailed(f"stream {stream_name!r} window {wid}: {len(failed)} task(s) failed after retries: {detail}")
    manifest = join_window(job, stream_name, window_start)
    return WindowResult(manifest, sink_window(job, stream_name, window_start), stats)
