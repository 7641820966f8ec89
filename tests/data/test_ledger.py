from __future__ import annotations

import time

import pytest

from primus_lib.data.ledger import FAILED, PENDING, TaskLedger
from primus_lib.data.task import DataTask


def _tasks(window: str, n: int) -> list[DataTask]:
    return [
        DataTask(f"s.{window}.src.{i:05d}", "s", "src", window, f"file:///f{i}", f"/f{i}", "parquet", 1)
        for i in range(n)
    ]


def test_windows_are_planned_once_and_tasks_claimed_in_time_order(tmp_path):
    ledger = TaskLedger(tmp_path / "ledger.sqlite")
    assert ledger.add_window("s", "20261101T010000Z", _tasks("20261101T010000Z", 2))
    assert ledger.add_window("s", "20261101T000000Z", _tasks("20261101T000000Z", 2))
    assert not ledger.add_window("s", "20261101T000000Z", _tasks("20261101T000000Z", 5))  # already planned
    order = [ledger.claim("e1").id for _ in range(4)]
    assert order == ["s.20261101T000000Z.src.00000", "s.20261101T000000Z.src.00001",
                     "s.20261101T010000Z.src.00000", "s.20261101T010000Z.src.00001"]  # fmt: skip
    assert ledger.claim("e1") is None
    assert ledger.counts("s") == {"pending": 0, "running": 4, "succeeded": 0, "failed": 0}
    # the ledger is shared by processes: a fresh handle sees the same state
    assert TaskLedger(tmp_path / "ledger.sqlite").counts("s")["running"] == 4


def test_failures_retry_up_to_the_limit(tmp_path):
    ledger = TaskLedger(tmp_path / "ledger.sqlite", max_attempts=2)
    ledger.add_window("s", "w", _tasks("w", 1))
    task = ledger.claim("e1")
    assert ledger.fail(task.id, "e1", "boom") == PENDING
    task = ledger.claim("e2")
    assert ledger.fail(task.id, "e2", "boom again") == FAILED
    assert ledger.claim("e3") is None
    record = ledger.records("s")[0]
    assert record.state == FAILED and record.attempts == 2 and "boom again" in record.error
    assert ledger.retry_failed("s") == 1 and ledger.claim("e3").id == task.id


def test_tasks_of_a_dead_executor_go_back_to_pending(tmp_path):
    ledger = TaskLedger(tmp_path / "ledger.sqlite", heartbeat_timeout=30)
    ledger.add_window("s", "w", _tasks("w", 3))
    a = ledger.claim("dead")
    b = ledger.claim("alive")
    assert ledger.reclaim_dead() == 0
    assert ledger.reclaim_dead(now=time.time() + 31 - 0) >= 1  # both silent for 31 s
    ledger.heartbeat("alive")
    assert {r.task.id: r.state for r in ledger.records("s")}[a.id] == PENDING
    assert not ledger.succeed(a.id, "dead", {})  # a late success from the dead executor is refused
    c = ledger.claim("alive")
    assert c.id in (a.id, b.id)
    assert ledger.release_executor("alive") == 1
    assert ledger.counts("s")["running"] == 0


def test_stream_tasks_are_assigned_or_not(tmp_path):
    ledger = TaskLedger(tmp_path / "ledger.sqlite")
    ledger.assign_stream("rt", "events/0", "x1")
    ledger.assign_stream("rt", "events/1", "x2")
    assert ledger.stream_assignments("rt") == {"events/0": "x1", "events/1": "x2"}
    assert ledger.unassign_executor("x2") == 1
    assert ledger.stream_assignments("rt") == {"events/0": "x1", "events/1": None}


def test_training_queue_closes_every_connection_it_opens(tmp_path):
    """``with sqlite3.connect()`` only ends a transaction; a long-lived trainer polling the queue
    must not pile up open connections (file descriptors) to the ledger."""
    import sqlite3

    from primus_lib.data.training_queue import OutOfOrderWindow, TrainingQueue

    opened: list[sqlite3.Connection] = []

    class Tracked(TrainingQueue):
        def _connect(self) -> sqlite3.Connection:
            opened.append(super()._connect())
            return opened[-1]

    queue = Tracked(tmp_path / "ledger.sqlite")
    queue.append("s", "20261101T010000Z", "/w1", 10)
    assert [w.window for w in queue.windows("s")] == ["20261101T010000Z"]
    with pytest.raises(OutOfOrderWindow):
        queue.append("s", "20261101T000000Z", "/w0", 10)
    assert len(opened) == 4
    for db in opened:
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            db.execute("SELECT 1")
