"""A batch data task's report to the Dynamic Scaling Manager (the embedded default's executors are
the mapped Airflow tasks, one short process per unit of tasks): CPU and memory of the task against
the role's allocation, rows produced, and the fill of the batch "buffer" the executors feed:
windows produced but not yet trained. One snapshot per task, written when it ends, named by the
task id so concurrent tasks do not clobber each other; snapshots past the readers' age are
pruned. Any failure here is logged and ignored: metrics never fail a data task."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from primus_lib.allocation import role_resources
from primus_lib.metrics.instruments import ExecutorMetrics
from primus_lib.metrics.reporting import guarded, prune_stale, snapshot_name, write_snapshot_to
from primus_lib.paths import JobPaths
from primus_lib.progress import progress_key, read_progress
from primus_lib.spec.job import PrimusJob

ROLE = "data_executor"


def batch_backlog(job: PrimusJob) -> float:
    """Committed batch windows the trainer has not consumed yet, over the windows the pipeline may
    run ahead (0: the trainer has everything the executors made; 1: a full pipeline waits). Read
    per task; a value is reused only while the local files it came from (the ledger, its WAL,
    progress.json) are unchanged and were last written well before it was read: a commit or a
    consume writes one of them, which changes its size, inode or mtime (a timer-based cache went
    stale exactly when a window committed). Reading costs ~2 ms (SQLite through SQLAlchemy)."""
    paths = JobPaths.for_job(job)
    progress = paths.progress.version()
    ledger = paths.sqlite_ledger
    if ledger is None or progress is None:  # PostgreSQL, or progress.json on an object store: no file to watch
        return _read_backlog(job)
    key = (str(ledger), job.spec.airflow.max_active_runs, tuple(sorted(s.name for s in job.batch_streams)))
    state = [_stat(ledger), _stat(Path(f"{ledger}-wal")), progress]
    cached = _backlogs.get(key)
    if cached is not None and cached[0] == state:
        return cached[1]
    read_at = time.time()
    value = _read_backlog(job)
    newest = max((s[3] for s in state if s is not None), default=0) / 1e9
    if read_at - newest > _SETTLED_S:  # a later write gets a later mtime: the state key will change
        if len(_backlogs) >= 8:
            _backlogs.pop(next(iter(_backlogs)))
        _backlogs[key] = (state, value)
    return value


_SETTLED_S = 0.1  # well above file timestamps' granularity (a kernel tick, <= 10 ms)
_backlogs: dict[tuple, tuple[list, float]] = {}


def _stat(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _read_backlog(job: PrimusJob) -> float:
    paths = JobPaths.for_job(job)
    streams = {s.name for s in job.batch_streams}
    if not streams:
        return 0.0
    sqlite = paths.sqlite_ledger
    if sqlite is None:  # the database the spec names
        windows = [(w.stream, w.window) for w in _queue(str(paths.ledger), paths.ledger).windows()]
    elif sqlite.exists():  # the SQLite file, once a role made it
        windows = _queued_in_sqlite(sqlite)
    else:
        return 0.0
    queued = {progress_key(stream, window) for stream, window in windows if stream in streams}
    waiting = len(queued - set(read_progress(paths.progress)["consumed"]))
    ahead = job.spec.airflow.max_active_runs * len(streams)  # the windows the DAG runs at once
    return min(1.0, waiting / max(1, ahead))


def _queued_in_sqlite(ledger: Path) -> list[tuple[str, str]]:
    """(stream, window) of every window in a local ledger's training queue, read with the standard
    library's sqlite3: the same rows as ``TrainingQueue(ledger).windows()`` (tested), without
    importing SQLAlchemy (~0.3 s) in a data task's process, which runs this once."""
    with contextlib.closing(sqlite3.connect(ledger, timeout=30)) as db:
        try:
            return db.execute('SELECT stream, "window" FROM training_queue ORDER BY seq').fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):  # a ledger the Sink has not queued into yet
                return []
            raise


_queues: dict[str, object] = {}  # ledger -> TrainingQueue: a runner reuses its engine across tasks


def _queue(key: str, ledger):
    from primus_lib.data.training_queue import TrainingQueue

    if key not in _queues:
        if len(_queues) >= 8:
            _queues.pop(next(iter(_queues)))
        _queues[key] = TrainingQueue(ledger)
    return _queues[key]


class TaskMetrics:
    """Started with the task (psutil measures CPU from here), finished with its row count."""

    def __init__(self, job: PrimusJob, task_id: str, allotment: tuple[float, float] | None = None) -> None:
        self.job, self.task_id = job, task_id
        cpu, memory = allotment or role_resources(job, ROLE)
        self.registry = CollectorRegistry()
        self.metrics = ExecutorMetrics(job.name, task_id, cpu, memory, role=ROLE, registry=self.registry)

    @classmethod
    def start(cls, job: PrimusJob, task_id: str, allotment: tuple[float, float] | None = None) -> TaskMetrics | None:
        """None when the job has no batch data-executor role or the metrics cannot be set up. ``allotment``:
        the role's (cores, bytes) as the task read them (else read here: on S3 a request)."""
        if ROLE not in job.spec.resources.roles:
            return None
        made: list[TaskMetrics] = []
        guarded("data task metrics", lambda: made.append(cls(job, task_id, allotment)))
        return made[0] if made else None

    def finish(self, rows: int) -> None:
        guarded(f"data task {self.task_id} metrics", lambda: self._finish(rows))

    def _finish(self, rows: int) -> None:
        self.metrics.observe_process()  # its own CPU since start, its tree's RSS
        self.metrics.add_samples(rows)
        self.metrics.observe_buffer(batch_backlog(self.job), 1.0)
        directory = JobPaths.for_job(self.job).metrics_dir
        write_snapshot_to(directory, snapshot_name(ROLE, self.task_id), self.registry)
        now = time.monotonic()
        if now - _pruned.get(str(directory), float("-inf")) >= PRUNE_EVERY_S:  # a scan of every snapshot
            _pruned[str(directory)] = now
            prune_stale(directory)


PRUNE_EVERY_S = 60.0  # stale snapshots are ignored by readers anyway; a runner prunes once a minute
_pruned: dict[str, float] = {}
