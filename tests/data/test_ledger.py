"""The task ledger's behaviour, on both backends: SQLite (the embedded default) and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from primus_lib.data.db import dispose
from primus_lib.data.ledger import FAILED, PENDING, RUNNING, SUCCEEDED, TaskLedger
from primus_lib.data.task import DataTask

BACKENDS = ["sqlite", pytest.param("postgres", marks=[pytest.mark.postgres, pytest.mark.integration])]


@pytest.fixture(params=BACKENDS)
def database(request, tmp_path) -> Iterator[Path | str]:
    """The location of a fresh, empty ledger: a SQLite file, or a new PostgreSQL database's URL."""
    if request.param == "sqlite":
        yield tmp_path / "ledger.sqlite"
        return
    url = request.getfixturevalue("postgres_server").create_database("ledger")
    yield url
    dispose(url)  # this process's pooled connections to a database no other test uses


def _tasks(window: str, n: int, source: str = "src") -> list[DataTask]:
    return [
        DataTask(f"s.{window}.{source}.{i:05d}", "s", source, window, f"file:///f{i}", f"/f{i}", "parquet", 1)
        for i in range(n)
    ]


def test_windows_are_planned_once_and_tasks_claimed_in_time_order(database):
    ledger = TaskLedger(database)
    assert ledger.add_window("s", "20261101T010000Z", _tasks("20261101T010000Z", 2))
    assert ledger.add_window("s", "20261101T000000Z", _tasks("20261101T000000Z", 2))
    assert not ledger.add_window("s", "20261101T000000Z", _tasks("20261101T000000Z", 5))  # already planned
    order = [ledger.claim("e1").id for _ in range(4)]
    assert order == [
        "s.20261101T000000Z.src.00000",
        "s.20261101T000000Z.src.00001",
        "s.20261101T010000Z.src.00000",
        "s.20261101T010000Z.src.00001",
    ]
    assert ledger.claim("e1") is None
    assert ledger.counts("s") == {"pending": 0, "running": 4, "succeeded": 0, "failed": 0}
    # the ledger is shared by processes: a fresh handle sees the same state
    assert TaskLedger(database).counts("s")["running"] == 4


def test_planning_queries_serve_what_was_planned(database):
    ledger = TaskLedger(database)
    w0, w1, w2 = "20261101T000000Z", "20261101T010000Z", "20261101T020000Z"
    chunk = [(w1, _tasks(w1, 2) + _tasks(w1, 1, "clk")), (w0, _tasks(w0, 3)), (w1, _tasks(w1, 9)), (w2, [])]
    assert ledger.add_windows("s", chunk) == 3  # the repeated w1 is skipped; an empty window counts
    assert ledger.add_windows("s", [(w0, _tasks(w0, 1))]) == 0
    assert ledger.planned("s", w1) and not ledger.planned("s", "20261101T030000Z") and not ledger.planned("t", w1)
    assert ledger.planned_windows("s") == [w0, w1, w2] and ledger.planned_windows("t") == []
    found = ledger.tasks_by_window("s", [w0, w2])
    assert found == {w0: _tasks(w0, 3), w2: []} and ledger.tasks_by_window("s", []) == {}
    assert ledger.tasks("s", w1) == _tasks(w1, 2) + _tasks(w1, 1, "clk")  # planned order
    assert ledger.tasks("s", w1, source="clk") == _tasks(w1, 1, "clk")
    assert ledger.counts() == {"pending": 6, "running": 0, "succeeded": 0, "failed": 0}
    assert ledger.claim("e1", stream="s", window=w1).id == f"s.{w1}.src.00000"  # narrowed to one window
    assert ledger.claim("e1", stream="other") is None


def test_success_output_is_recorded_and_a_stale_report_changes_nothing(database):
    ledger = TaskLedger(database)
    ledger.add_window("s", "w", _tasks("w", 2))
    a, b = ledger.claim("e1"), ledger.claim("e1")
    assert ledger.succeed(a.id, "e1", {"rows": 7, "path": "/x"})
    assert not ledger.succeed(a.id, "e1", {"rows": 8})  # already succeeded
    assert not ledger.succeed(b.id, "e2", {})  # not e2's task
    assert ledger.fail(b.id, "e2", "boom") == "stale"
    records = {r.task.id: r for r in ledger.records("s", "w")}
    assert records[a.id].state == SUCCEEDED and records[a.id].output == {"rows": 7, "path": "/x"}
    assert records[b.id].state == RUNNING and records[b.id].executor == "e1" and records[b.id].attempts == 1
    assert ledger.succeed(b.id, "e1") and ledger.records("s", "w")[1].output is None


def test_failures_retry_up_to_the_limit(database):
    ledger = TaskLedger(database, max_attempts=2)
    ledger.add_window("s", "w", _tasks("w", 1))
    task = ledger.claim("e1")
    assert ledger.fail(task.id, "e1", "boom") == PENDING
    task = ledger.claim("e2")
    assert ledger.fail(task.id, "e2", "x" * 5000 + "boom again") == FAILED
    assert ledger.claim("e3") is None
    record = ledger.records("s")[0]
    assert record.state == FAILED and record.attempts == 2 and record.error.endswith("boom again")
    assert len(record.error) == 4000  # the tail of a long traceback
    assert ledger.retry_failed("s", window="other") == 0
    assert ledger.retry_failed("s") == 1 and ledger.claim("e3").id == task.id


def test_tasks_of_a_dead_executor_go_back_to_pending(database):
    ledger = TaskLedger(database, heartbeat_timeout=30)
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


def test_reclaim_fails_a_task_whose_attempts_are_used_up(database):
    ledger = TaskLedger(database, max_attempts=1, heartbeat_timeout=30)
    ledger.add_window("s", "w", _tasks("w", 2))
    a = ledger.claim("gone")
    assert ledger.reclaim_dead(now=time.time() + 60) == 1
    record = {r.task.id: r for r in ledger.records("s")}[a.id]
    assert record.state == FAILED and record.error == "executor gone lost (heartbeat)" and record.executor is None
    assert ledger.counts("s") == {"pending": 1, "running": 0, "succeeded": 0, "failed": 1}


def test_stream_tasks_are_assigned_or_not(database):
    ledger = TaskLedger(database)
    ledger.assign_stream("rt", "events/0", "x1")
    ledger.assign_stream("rt", "events/1", "x2")
    assert ledger.stream_assignments("rt") == {"events/0": "x1", "events/1": "x2"}
    assert ledger.unassign_executor("x2") == 1
    assert ledger.stream_assignments("rt") == {"events/0": "x1", "events/1": None}
    ledger.assign_stream("rt", "events/1", "x1")  # reassigned: the same row, a new owner
    assert ledger.stream_assignments("rt") == {"events/0": "x1", "events/1": "x1"}
    assert ledger.stream_assignments("other") == {}
