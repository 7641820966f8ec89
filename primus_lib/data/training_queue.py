"""The job's ordered training queue: committed windows, appended by the Sink in time order.

Kept in the job's ledger (SQLite) so that the planner, the Airflow Sink and the trainer
share one source of truth. Appending a window again is a no-op; appending one older than
the newest committed window of the same stream is refused (global time order).
"""

from __future__ import annotations

import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS training_queue (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    stream TEXT NOT NULL,
    window TEXT NOT NULL,
    path TEXT NOT NULL,
    rows INTEGER NOT NULL,
    committed_at REAL NOT NULL,
    UNIQUE (stream, window)
)
"""


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
    def __init__(self, ledger: Path):
        self.ledger = Path(ledger)
        self.ledger.parent.mkdir(parents=True, exist_ok=True)
        with closing(self._connect()) as db:  # sqlite3's own context manager does not close
            db.execute(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.ledger, timeout=30, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def append(self, stream: str, window: str, path: str, rows: int) -> QueuedWindow:
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute(
                "SELECT seq, stream, window, path, rows FROM training_queue WHERE stream=? AND window=?",
                (stream, window),
            ).fetchone()
            if row is not None:
                db.execute("COMMIT")
                return QueuedWindow(*row)
            newest = db.execute("SELECT MAX(window) FROM training_queue WHERE stream=?", (stream,)).fetchone()[0]
            if newest is not None and window < newest:
                db.execute("ROLLBACK")
                raise OutOfOrderWindow(f"stream {stream!r}: window {window} arrived after {newest} was queued")
            cursor = db.execute(
                "INSERT INTO training_queue (stream, window, path, rows, committed_at) VALUES (?, ?, ?, ?, ?)",
                (stream, window, path, rows, time.time()),
            )
            db.execute("COMMIT")
            return QueuedWindow(cursor.lastrowid, stream, window, path, rows)
        finally:
            db.close()

    def windows(self, stream: str | None = None, after_seq: int = 0) -> list[QueuedWindow]:
        query = "SELECT seq, stream, window, path, rows FROM training_queue WHERE seq > ?"
        args: list = [after_seq]
        if stream is not None:
            query += " AND stream = ?"
            args.append(stream)
        with closing(self._connect()) as db:
            return [QueuedWindow(*row) for row in db.execute(query + " ORDER BY seq", args)]
