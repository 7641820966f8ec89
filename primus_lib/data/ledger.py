"""The data driver's task ledger: planned windows and the state of every batch data task.

Persisted in the job's ``ledger.sqlite`` (tables ``data_windows``, ``data_tasks``,
``data_executors``, ``stream_tasks``; the TrainingQueue shares the file), so a restarted
planner does not re-plan and a restarted driver knows what is left. Batch tasks move
pending -> running -> succeeded | failed; a failed attempt, or one whose executor died
(heartbeat timeout or an explicit release), goes back to pending until ``max_attempts``.
Stream tasks (topic-partitions) are only assigned to an executor or not.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from primus_lib.data.task import DataTask

PENDING, RUNNING, SUCCEEDED, FAILED = "pending", "running", "succeeded", "failed"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS data_windows (
    stream TEXT NOT NULL, window TEXT NOT NULL, tasks INTEGER NOT NULL, planned_at REAL NOT NULL,
    PRIMARY KEY (stream, window));
CREATE TABLE IF NOT EXISTS data_tasks (
    id TEXT PRIMARY KEY, stream TEXT NOT NULL, window TEXT NOT NULL, source TEXT NOT NULL,
    seq INTEGER NOT NULL, body TEXT NOT NULL, state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
    executor TEXT, error TEXT, output TEXT, updated REAL NOT NULL);
CREATE INDEX IF NOT EXISTS data_tasks_order ON data_tasks (state, stream, window, seq);
CREATE TABLE IF NOT EXISTS data_executors (id TEXT PRIMARY KEY, heartbeat REAL NOT NULL, alive INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS stream_tasks (
    stream TEXT NOT NULL, partition TEXT NOT NULL, executor TEXT, assigned_at REAL,
    PRIMARY KEY (stream, partition));
"""


@dataclass(frozen=True)
class TaskRecord:
    task: DataTask
    state: str
    attempts: int
    executor: str | None
    error: str | None
    output: dict | None


class TaskLedger:
    def __init__(self, path: Path, max_attempts: int = 3, heartbeat_timeout: float = 60.0):
        self.path = Path(path)
        self.max_attempts = max_attempts
        self.heartbeat_timeout = heartbeat_timeout
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)
        finally:
            db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            db.close()

    # -- planning (the Sink of the DTGG writes here) -------------------------------------
    def add_window(self, stream: str, window: str, tasks: Iterable[DataTask]) -> bool:
        """Record a planned window and its tasks in one transaction; False if already planned."""
        return self.add_windows(stream, [(window, list(tasks))]) == 1

    def add_windows(self, stream: str, windows: list[tuple[str, list[DataTask]]]) -> int:
        """Record several planned windows in one transaction (the Sink of a planning chunk);
        windows already planned are skipped. Returns how many were added."""
        now = time.time()
        added = 0
        with self._tx() as db:
            done = {r[0] for r in db.execute("SELECT window FROM data_windows WHERE stream=?", (stream,))}
            for window, tasks in windows:
                if window in done:
                    continue
                db.executemany(
                    "INSERT INTO data_tasks (id, stream, window, source, seq, body, state, updated) VALUES (?,?,?,?,?,?,?,?)",
                    [(t.id, stream, window, t.source, i, t.to_json(), PENDING, now) for i, t in enumerate(tasks)],
                )
                db.execute("INSERT INTO data_windows VALUES (?,?,?,?)", (stream, window, len(tasks), now))
                done.add(window)
                added += 1
        return added

    def tasks_by_window(self, stream: str, windows: list[str]) -> dict[str, list[DataTask]]:
        """The planned tasks of several windows in one query (cached task lists)."""
        if not windows:
            return {}
        out: dict[str, list[DataTask]] = {w: [] for w in windows}
        with self._tx() as db:
            rows = db.execute(
                "SELECT window, body FROM data_tasks WHERE stream=? AND window BETWEEN ? AND ? ORDER BY window, seq",
                (stream, min(windows), max(windows)),
            ).fetchall()
        for window, body in rows:
            if window in out:
                out[window].append(DataTask.from_json(body))
        return out

    def planned(self, stream: str, window: str) -> bool:
        with self._tx() as db:
            return (
                db.execute("SELECT 1 FROM data_windows WHERE stream=? AND window=?", (stream, window)).fetchone()
                is not None
            )

    def planned_windows(self, stream: str) -> list[str]:
        with self._tx() as db:
            return [
                r[0] for r in db.execute("SELECT window FROM data_windows WHERE stream=? ORDER BY window", (stream,))
            ]

    def tasks(self, stream: str, window: str, source: str | None = None) -> list[DataTask]:
        return [r.task for r in self.records(stream, window, source)]

    def records(self, stream: str, window: str | None = None, source: str | None = None) -> list[TaskRecord]:
        query, args = _filtered(
            "SELECT body, state, attempts, executor, error, output FROM data_tasks WHERE stream=?",
            [stream],
            window=window,
            source=source,
        )
        with self._tx() as db:
            rows = db.execute(query + " ORDER BY window, seq", args).fetchall()
        return [
            TaskRecord(DataTask.from_json(b), s, a, e, err, json.loads(o) if o else None) for b, s, a, e, err, o in rows
        ]

    def counts(self, stream: str | None = None) -> dict[str, int]:
        query, args = "SELECT state, COUNT(*) FROM data_tasks", []
        if stream is not None:
            query, args = query + " WHERE stream=?", [stream]
        with self._tx() as db:
            found = dict(db.execute(query + " GROUP BY state", args).fetchall())
        return {state: found.get(state, 0) for state in (PENDING, RUNNING, SUCCEEDED, FAILED)}

    # -- executing ---------------------------------------------------------------------
    def heartbeat(self, executor: str) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO data_executors VALUES (?, ?, 1)", (executor, time.time()))

    def claim(self, executor: str, stream: str | None = None, window: str | None = None) -> DataTask | None:
        """Hand the oldest pending task (time order) to ``executor``; None when none is pending."""
        query, args = _filtered(
            "SELECT id, body FROM data_tasks WHERE state=?", [PENDING], stream=stream, window=window
        )
        now = time.time()
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO data_executors VALUES (?, ?, 1)", (executor, now))
            row = db.execute(query + " ORDER BY window, seq LIMIT 1", args).fetchone()
            if row is None:
                return None
            db.execute(
                "UPDATE data_tasks SET state=?, attempts=attempts+1, executor=?, updated=? WHERE id=?",
                (RUNNING, executor, now, row[0]),
            )
            return DataTask.from_json(row[1])

    def succeed(self, task_id: str, executor: str, output: dict | None = None) -> bool:
        """Record success; False (and nothing changed) if the task was taken from ``executor``."""
        with self._tx() as db:
            cursor = db.execute(
                "UPDATE data_tasks SET state=?, output=?, error=NULL, updated=? WHERE id=? AND executor=? AND state=?",
                (SUCCEEDED, json.dumps(output) if output else None, time.time(), task_id, executor, RUNNING),
            )
            return cursor.rowcount == 1

    def fail(self, task_id: str, executor: str, error: str) -> str:
        """Record a failed attempt; the task goes back to pending unless attempts are used up."""
        with self._tx() as db:
            row = db.execute(
                "SELECT attempts FROM data_tasks WHERE id=? AND executor=? AND state=?", (task_id, executor, RUNNING)
            ).fetchone()
            if row is None:
                return "stale"
            state = FAILED if row[0] >= self.max_attempts else PENDING
            db.execute(
                "UPDATE data_tasks SET state=?, error=?, executor=NULL, updated=? WHERE id=?",
                (state, error[-4000:], time.time(), task_id),
            )
            return state

    def release_executor(self, executor: str, reason: str = "executor released") -> int:
        """An executor is gone (scaled in, killed): its running tasks go back to pending."""
        with self._tx() as db:
            db.execute("UPDATE data_executors SET alive=0 WHERE id=?", (executor,))
            return self._requeue(db, "executor=? AND state=?", (executor, RUNNING), reason)

    def reclaim_dead(self, now: float | None = None) -> int:
        """Running tasks of executors without a heartbeat for ``heartbeat_timeout`` go back to pending."""
        cutoff = (time.time() if now is None else now) - self.heartbeat_timeout
        with self._tx() as db:
            dead = [r[0] for r in db.execute("SELECT id FROM data_executors WHERE alive=0 OR heartbeat < ?", (cutoff,))]
            count = 0
            for executor in dead:
                db.execute("UPDATE data_executors SET alive=0 WHERE id=?", (executor,))
                count += self._requeue(
                    db, "executor=? AND state=?", (executor, RUNNING), f"executor {executor} lost (heartbeat)"
                )
            return count

    def _requeue(self, db: sqlite3.Connection, where: str, args: tuple, reason: str) -> int:
        now = time.time()
        db.execute(
            f"UPDATE data_tasks SET state=CASE WHEN attempts>=? THEN ? ELSE ? END, executor=NULL, error=?, updated=? WHERE {where}",
            (self.max_attempts, FAILED, PENDING, reason, now, *args),
        )
        return db.execute("SELECT changes()").fetchone()[0]

    def retry_failed(self, stream: str, window: str | None = None) -> int:
        """An operator's manual retry: failed tasks back to pending with fresh attempts."""
        query, args = _filtered(
            "UPDATE data_tasks SET state=?, attempts=0, updated=? WHERE state=? AND stream=?",
            [PENDING, time.time(), FAILED, stream],
            window=window,
        )
        with self._tx() as db:
            return db.execute(query, args).rowcount

    # -- stream tasks: assigned or not ----------------------------------------------------
    def assign_stream(self, stream: str, partition: str, executor: str | None) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO stream_tasks VALUES (?, ?, ?, ?)",
                (stream, partition, executor, time.time() if executor else None),
            )

    def stream_assignments(self, stream: str) -> dict[str, str | None]:
        with self._tx() as db:
            return dict(
                db.execute("SELECT partition, executor FROM stream_tasks WHERE stream=? ORDER BY partition", (stream,))
            )

    def unassign_executor(self, executor: str) -> int:
        with self._tx() as db:
            return db.execute(
                "UPDATE stream_tasks SET executor=NULL, assigned_at=NULL WHERE executor=?", (executor,)
            ).rowcount


def _filtered(query: str, args: list, **columns: str | None) -> tuple[str, list]:
    """``query`` (ending in a WHERE clause) narrowed by each column given a value."""
    for column, value in columns.items():
        if value is not None:
            query += f" AND {column}=?"
            args = [*args, value]
    return query, args
