"""The data driver's task ledger: planned windows and the state of every batch data task.

Persisted in the job's database (``primus_lib.data.db``: the job's ``ledger.sqlite``, or the
PostgreSQL database of ``spec.storage.database``; tables ``data_windows``, ``data_tasks``,
``data_executors``, ``stream_tasks``; the TrainingQueue shares it), so a restarted planner does
not re-plan and a restarted driver knows what is left. Batch tasks move
pending -> running -> succeeded | failed; a failed attempt, or one whose executor died
(heartbeat timeout or an explicit release), goes back to pending until ``max_attempts``.
Stream tasks (topic-partitions) are only assigned to an executor or not.

Concurrent writers (several planners, executors in many processes or machines): SQLite
serializes them (``BEGIN IMMEDIATE``); on PostgreSQL a claim locks the task it takes and skips
those other claimers hold (``FOR UPDATE SKIP LOCKED``), every state change is conditional on the
state it expects, and a window is planned once (``ON CONFLICT DO NOTHING`` on ``data_windows``).
Every operation runs again when the PostgreSQL connection is lost (``db.retried``: a server
restart); those whose first commit may have landed unseen (claim, succeed) recognise it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import Connection, case, func, or_, select, update

from primus_lib.data.db import (
    Location,
    as_location,
    data_executors,
    data_tasks,
    data_windows,
    insert_many,
    insert_missing,
    open_database,
    retried,
    shown,
    stream_tasks,
    transaction,
    upsert,
)
from primus_lib.data.task import DataTask

PENDING, RUNNING, SUCCEEDED, FAILED = "pending", "running", "succeeded", "failed"
T, EX = data_tasks.c, data_executors.c


@dataclass(frozen=True)
class TaskRecord:
    task: DataTask
    state: str
    attempts: int
    executor: str | None
    error: str | None
    output: dict | None


class TaskLedger:
    def __init__(self, path: Location, max_attempts: int = 3, heartbeat_timeout: float = 60.0):
        """``path``: the SQLite file, or the URL of the job's PostgreSQL database (``JobPaths.ledger``)."""
        self.path = as_location(path)
        self.max_attempts = max_attempts
        self.heartbeat_timeout = heartbeat_timeout
        self.engine = open_database(self.path)

    def __repr__(self) -> str:
        return f"TaskLedger({shown(self.path)})"  # no password

    def _tx(self, write: bool = True):
        return transaction(self.engine, write=write)

    # -- planning (the Sink of the DTGG writes here) -------------------------------------
    def add_window(self, stream: str, window: str, tasks: Iterable[DataTask]) -> bool:
        """Record a planned window and its tasks in one transaction; False if already planned."""
        return self.add_windows(stream, [(window, list(tasks))]) == 1

    @retried
    def add_windows(self, stream: str, windows: list[tuple[str, list[DataTask]]]) -> int:
        """Record several planned windows in one transaction (the Sink of a planning chunk);
        windows already planned (also by a concurrent planner) are skipped. Returns how many were added."""
        now = time.time()
        with self._tx() as db:
            done = set(db.scalars(select(data_windows.c.window).where(data_windows.c.stream == stream)))
            fresh: dict[str, list[DataTask]] = {}
            for window, tasks in windows:
                if window not in done:
                    fresh.setdefault(window, tasks)
            if not fresh:
                return 0
            planned = [{"stream": stream, "window": w, "tasks": len(t), "planned_at": now} for w, t in fresh.items()]
            added = insert_missing(db, data_windows, sorted(planned, key=lambda r: r["window"]), "window")
            insert_many(
                db, data_tasks, [_row(stream, w, i, t, now) for w in sorted(added) for i, t in enumerate(fresh[w])]
            )
        return len(added)

    @retried
    def tasks_by_window(self, stream: str, windows: list[str]) -> dict[str, list[DataTask]]:
        """The planned tasks of several windows in one query (cached task lists)."""
        if not windows:
            return {}
        out: dict[str, list[DataTask]] = {w: [] for w in windows}
        query = select(T.window, T.body).where(T.stream == stream, T.window.between(min(windows), max(windows)))
        with self._tx(write=False) as db:
            rows = db.execute(query.order_by(T.window, T.seq)).all()
        for window, body in rows:
            if window in out:
                out[window].append(DataTask.from_json(body))
        return out

    @retried
    def planned(self, stream: str, window: str) -> bool:
        query = select(1).where(data_windows.c.stream == stream, data_windows.c.window == window)
        with self._tx(write=False) as db:
            return db.execute(query).first() is not None

    @retried
    def planned_windows(self, stream: str) -> list[str]:
        query = select(data_windows.c.window).where(data_windows.c.stream == stream).order_by(data_windows.c.window)
        with self._tx(write=False) as db:
            return list(db.scalars(query))

    def tasks(self, stream: str, window: str, source: str | None = None) -> list[DataTask]:
        return [r.task for r in self.records(stream, window, source)]

    @retried
    def records(self, stream: str, window: str | None = None, source: str | None = None) -> list[TaskRecord]:
        query = select(T.body, T.state, T.attempts, T.executor, T.error, T.output).where(
            T.stream == stream, *_filters(window=window, source=source)
        )
        with self._tx(write=False) as db:
            rows = db.execute(query.order_by(T.window, T.seq)).all()
        return [
            TaskRecord(DataTask.from_json(b), s, a, e, err, json.loads(o) if o else None) for b, s, a, e, err, o in rows
        ]

    @retried
    def counts(self, stream: str | None = None) -> dict[str, int]:
        query = select(T.state, func.count()).where(*_filters(stream=stream)).group_by(T.state)
        with self._tx(write=False) as db:
            found = dict(db.execute(query).tuples().all())
        return {state: found.get(state, 0) for state in (PENDING, RUNNING, SUCCEEDED, FAILED)}

    # -- executing ---------------------------------------------------------------------
    @retried
    def heartbeat(self, executor: str) -> None:
        with self._tx() as db:
            upsert(db, data_executors, id=executor, heartbeat=time.time(), alive=1)

    def claim(self, executor: str, stream: str | None = None, window: str | None = None) -> DataTask | None:
        """Hand the oldest pending task (time order) to ``executor``; None when none is pending.
        Concurrent claimers never get the same task: on PostgreSQL each locks the row it takes
        and skips rows locked by the others. A claim whose commit was cut off by a lost
        connection is found again on the retry (its executor and its exact ``updated`` stamp)."""
        query = (
            select(T.id, T.body)
            .where(T.state == PENDING, *_filters(stream=stream, window=window))
            .order_by(T.window, T.seq)
            .limit(1)
            .with_for_update(skip_locked=True)  # SQLite: no-op, BEGIN IMMEDIATE serializes claims
        )
        now = time.time()
        claimed = {"state": RUNNING, "attempts": T.attempts + 1, "executor": executor, "updated": now}
        mine = select(T.body).where(T.state == RUNNING, T.executor == executor, T.updated == now).limit(1)
        tries = 0

        @retried
        def attempt() -> DataTask | None:
            nonlocal tries
            tries += 1
            with self._tx() as db:
                if tries > 1 and (body := db.scalar(mine)) is not None:  # the lost attempt did commit
                    return DataTask.from_json(body)
                upsert(db, data_executors, id=executor, heartbeat=now, alive=1)
                while (row := db.execute(query).first()) is not None:  # a row taken meanwhile: the next one
                    if db.execute(
                        update(data_tasks).where(T.id == row.id, T.state == PENDING).values(claimed)
                    ).rowcount:
                        return DataTask.from_json(row.body)
                return None

        return attempt()

    def succeed(self, task_id: str, executor: str, output: dict | None = None) -> bool:
        """Record success; False (and nothing changed) if the task was taken from ``executor`` or
        is done already, except when this call's own commit was cut off by a lost connection."""
        done = {"state": SUCCEEDED, "output": json.dumps(output) if output else None, "error": None}
        mine = (T.id == task_id, T.executor == executor)
        tries = 0

        @retried
        def attempt() -> bool:
            nonlocal tries
            tries += 1
            with self._tx() as db:
                changes = {**done, "updated": time.time()}
                if db.execute(update(data_tasks).where(*mine, T.state == RUNNING).values(changes)).rowcount:
                    return True
                return tries > 1 and db.scalar(select(T.state).where(*mine)) == SUCCEEDED

        return attempt()

    @retried
    def fail(self, task_id: str, executor: str, error: str) -> str:
        """Record a failed attempt; the task goes back to pending unless attempts are used up."""
        mine = (T.id == task_id, T.executor == executor, T.state == RUNNING)
        with self._tx() as db:
            attempts = db.scalar(select(T.attempts).where(*mine).with_for_update())
            if attempts is None:
                return "stale"
            state = FAILED if attempts >= self.max_attempts else PENDING
            changes = {"state": state, "error": error[-4000:], "executor": None, "updated": time.time()}
            db.execute(update(data_tasks).where(*mine).values(changes))
            return state

    @retried
    def release_executor(self, executor: str, reason: str = "executor released") -> int:
        """An executor is gone (scaled in, killed): its running tasks go back to pending."""
        with self._tx() as db:
            db.execute(update(data_executors).where(EX.id == executor).values(alive=0))
            return self._requeue(db, executor, reason)

    @retried
    def reclaim_dead(self, now: float | None = None) -> int:
        """Running tasks of executors without a heartbeat for ``heartbeat_timeout`` go back to pending."""
        cutoff = (time.time() if now is None else now) - self.heartbeat_timeout
        silent = or_(EX.alive == 0, EX.heartbeat < cutoff)
        with self._tx() as db:
            count = 0
            for executor in db.scalars(select(EX.id).where(silent).order_by(EX.id)).all():
                # still silent now that its row is locked (it may have beaten since the SELECT)
                if db.execute(update(data_executors).where(EX.id == executor, silent).values(alive=0)).rowcount:
                    count += self._requeue(db, executor, f"executor {executor} lost (heartbeat)")
            return count

    def _requeue(self, db: Connection, executor: str, reason: str) -> int:
        state = case((T.attempts >= self.max_attempts, FAILED), else_=PENDING)
        return db.execute(
            update(data_tasks)
            .where(T.executor == executor, T.state == RUNNING)
            .values(state=state, executor=None, error=reason, updated=time.time())
        ).rowcount

    @retried
    def retry_failed(self, stream: str, window: str | None = None) -> int:
        """An operator's manual retry: failed tasks back to pending with fresh attempts."""
        with self._tx() as db:
            return db.execute(
                update(data_tasks)
                .where(T.state == FAILED, T.stream == stream, *_filters(window=window))
                .values(state=PENDING, attempts=0, updated=time.time())
            ).rowcount

    # -- stream tasks: assigned or not ----------------------------------------------------
    @retried
    def assign_stream(self, stream: str, partition: str, executor: str | None) -> None:
        with self._tx() as db:
            at = time.time() if executor else None
            upsert(db, stream_tasks, stream=stream, partition=partition, executor=executor, assigned_at=at)

    @retried
    def stream_assignments(self, stream: str) -> dict[str, str | None]:
        c = stream_tasks.c
        with self._tx(write=False) as db:
            rows = db.execute(select(c.partition, c.executor).where(c.stream == stream).order_by(c.partition))
            return dict(rows.tuples().all())

    @retried
    def unassign_executor(self, executor: str) -> int:
        c = stream_tasks.c
        with self._tx() as db:
            return db.execute(
                update(stream_tasks).where(c.executor == executor).values(executor=None, assigned_at=None)
            ).rowcount


def _row(stream: str, window: str, seq: int, task: DataTask, now: float) -> dict:
    return {
        "id": task.id,
        "stream": stream,
        "window": window,
        "source": task.source,
        "seq": seq,
        "body": task.to_json(),
        "state": PENDING,
        "updated": now,
    }


def _filters(**columns: str | None) -> list:
    """``data_tasks.column == value`` for each column given a value (the optional filters)."""
    return [T[column] == value for column, value in columns.items() if value is not None]
