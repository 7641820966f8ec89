"""The job's ordered training queue: committed windows, appended by the Sink in time order.

Kept in the job's database with the ledger (``primus_lib.data.db``: SQLite by default,
PostgreSQL when the spec names one) so that the planner, the Airflow Sink and the trainer
share one source of truth. Appending a window again is a no-op; appending one older than
the newest committed window of the same stream is refused (global time order).

Appends are serialized (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: an EXCLUSIVE table lock, which
readers pass): of two Sinks appending at once the second sees the first's window, so they cannot
both pass the order check, and ``seq`` grows in commit order, so a reader polling with
``after_seq`` never skips a window committed later with a smaller ``seq``. Both run again after
a lost PostgreSQL connection (``db.retried``); an append repeated after an unseen commit finds
its window queued and returns it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import bindparam, func, select

from primus_lib.data.db import (
    Location,
    as_location,
    lock_table,
    open_database,
    retried,
    shown,
    training_queue,
    transaction,
)

Q = training_queue.c
_COLUMNS = (Q.seq, Q.stream, Q.window, Q.path, Q.rows)  # a QueuedWindow
_WINDOWS = select(*_COLUMNS).where(Q.seq > bindparam("after")).order_by(Q.seq)
_STREAM_WINDOWS = _WINDOWS.where(Q.stream == bindparam("stream"))  # built once: the trainer polls often


class OutOfOrderWindow(ValueError):
    """A window arrived after a later one of the same stream was already queued."""


@dataclass(frozen=True)
class QueuedWindow:
    seq: int
    stream: str
    window: str
    path: str
    rows: int


class TrainingQueue:
    def __init__(self, ledger: Location):
        """``ledger``: the SQLite file, or the URL of the job's PostgreSQL database (``JobPaths.ledger``)."""
        self.ledger = as_location(ledger)
        self.engine = open_database(self.ledger)

    def __repr__(self) -> str:
        return f"TrainingQueue({shown(self.ledger)})"  # no password

    @retried
    def append(self, stream: str, window: str, path: str, rows: int) -> QueuedWindow:
        with transaction(self.engine) as db:
            lock_table(db, training_queue)
            row = db.execute(select(*_COLUMNS).where(Q.stream == stream, Q.window == window)).first()
            if row is not None:
                return QueuedWindow(*row.tuple())
            newest = db.scalar(select(func.max(Q.window)).where(Q.stream == stream))
            if newest is not None and window < newest:
                raise OutOfOrderWindow(f"stream {stream!r}: window {window} arrived after {newest} was queued")
            values = {"stream": stream, "window": window, "path": path, "rows": rows, "committed_at": time.time()}
            key = db.execute(training_queue.insert().values(values)).inserted_primary_key
            if key is None:  # only for a key without autoincrement; seq has it
                raise RuntimeError(
                    f"training queue {shown(self.ledger)}: the insert of {stream} {window} returned no seq"
                )
            seq = key[0]
            return QueuedWindow(seq, stream, window, path, rows)

    @retried
    def windows(self, stream: str | None = None, after_seq: int = 0) -> list[QueuedWindow]:
        query = _WINDOWS if stream is None else _STREAM_WINDOWS
        with transaction(self.engine, write=False) as db:
            return [QueuedWindow(*row.tuple()) for row in db.execute(query, {"after": after_seq, "stream": stream})]
