"""The training queue's behaviour, on both backends (the ``database`` fixture of test_ledger.py)."""

from __future__ import annotations

import pytest
from sqlalchemy import event

from primus_lib.data.db import engine_for
from primus_lib.data.training_queue import OutOfOrderWindow, QueuedWindow, TrainingQueue
from tests.data.test_ledger import database  # noqa: F401 - the fixture: SQLite file or PostgreSQL URL

W0, W1, W2 = "20261101T000000Z", "20261101T010000Z", "20261101T020000Z"


def test_windows_are_queued_in_time_order_once_each(database):  # noqa: F811
    queue = TrainingQueue(database)
    first = queue.append("s", W0, "/w0", 10)
    assert first == QueuedWindow(1, "s", W0, "/w0", 10)
    assert queue.append("t", W2, "/t2", 5).seq == 2  # streams are ordered independently
    assert queue.append("s", W1, "/w1", 11) == QueuedWindow(3, "s", W1, "/w1", 11)
    assert queue.append("s", W0, "/elsewhere", 99) == first  # again: a no-op returning the queued one
    with pytest.raises(OutOfOrderWindow, match=r"stream 's': window 20261031T230000Z arrived after 20261101T010000Z"):
        queue.append("s", "20261031T230000Z", "/old", 1)
    assert [w.window for w in queue.windows("s")] == [W0, W1]
    assert [w.seq for w in queue.windows()] == [1, 2, 3]
    assert [w.window for w in queue.windows(after_seq=1)] == [W2, W1]
    assert queue.windows("t", after_seq=2) == []
    assert TrainingQueue(database).windows("s") == queue.windows("s")  # another handle, same state


def test_a_refused_window_leaves_nothing_behind(database):  # noqa: F811
    queue = TrainingQueue(database)
    queue.append("s", W1, "/w1", 1)
    with pytest.raises(OutOfOrderWindow):
        queue.append("s", W0, "/w0", 1)
    assert queue.append("s", W2, "/w2", 1).seq == 2  # the refused append used no seq
    assert [w.window for w in queue.windows()] == [W1, W2]


def test_the_queue_holds_no_connection_between_calls(database):  # noqa: F811
    """A long-lived trainer polls the queue for hours: no call may keep a connection checked out,
    and connections must not pile up (SQLite: one per call, closed; PostgreSQL: a small pool)."""
    engine = engine_for(database)
    seen: dict[str, int] = {"connect": 0, "close": 0, "checkout": 0, "checkin": 0}
    for name in seen:
        event.listen(engine.pool, name, lambda *_, name=name: seen.__setitem__(name, seen[name] + 1))
    queue = TrainingQueue(database)
    queue.append("s", W1, "/w1", 10)
    for _ in range(50):
        assert [w.window for w in queue.windows("s")] == [W1]
    with pytest.raises(OutOfOrderWindow):
        queue.append("s", W0, "/w0", 10)
    assert seen["checkout"] == seen["checkin"] == 53  # schema, append, 50 polls, refused append
    if engine.dialect.name == "sqlite":
        assert seen["connect"] == seen["close"] == 53  # no pool: each closed when its call ends
    else:
        assert seen["connect"] - seen["close"] <= 2 and engine.pool.checkedin() <= 2  # pool_size
