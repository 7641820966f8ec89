"""A stream executor's buffer whose rows leave only when a reader acknowledges them.

A ``DoGet`` takes rows out under a lease: they no longer wait in the buffer but still count
against its capacity (so Kafka is not polled for more while they are out), and the executor keeps
them until the reader acknowledges them: ``ack {"position": {key: offset}}`` releases every leased
row below its partition's offset (the trainer's reader acks each batch as soon as it holds it;
``commit`` acknowledges too). A lease not acknowledged within ``hold`` seconds (the reader's stream
broke, the reader died or never acks) goes back to the front of the buffer, oldest lease first, so
the next ``DoGet`` serves those rows again, in their offset order. A ``seek`` (``clear``) drops the
leases with the waiting rows; a partition the executor stops serving (``drop``) loses its leased rows.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from primus_lib.data.buffer import SampleBuffer, _Item

LEASE_SECONDS = 30.0  # how long rows handed to a reader wait for its ack before they are served again
Tagged = tuple[pa.RecordBatch, list[str], np.ndarray]


@dataclass
class _Lease:
    deadline: float
    batch: pa.RecordBatch
    keys: list[str]
    offsets: np.ndarray

    def keep(self, mask: np.ndarray) -> int:
        """Keep the rows where ``mask`` is set; returns how many went."""
        gone = len(mask) - int(mask.sum())
        if gone:
            rows = np.flatnonzero(mask)
            self.batch, self.offsets = self.batch.take(pa.array(rows)), self.offsets[rows]
            self.keys = [self.keys[i] for i in rows]
        return gone


class LeasedBuffer(SampleBuffer):
    def __init__(self, capacity_rows: int, hold: float = LEASE_SECONDS):
        if hold <= 0:
            raise ValueError(f"lease hold must be positive seconds, got {hold}")
        super().__init__(capacity_rows)
        self.hold = hold
        self._leases: deque[_Lease] = deque()
        self.served_again = 0  # rows whose lease ran out: back in the buffer

    def lease(self, rows: int, timeout: float | None = None) -> Tagged | None:
        """Up to ``rows`` tagged rows (as ``pop_tagged``), leased to the caller until acknowledged."""
        self.expire()
        with self._cond:  # the pop and its lease in one step: a seek never leaves a stale lease behind
            got = self.pop_tagged(rows, timeout)
            if got is not None and len(got[2]):
                self._held += got[0].num_rows
                self._leases.append(_Lease(time.monotonic() + self.hold, *got))
            return got

    def ack(self, position: dict[str, int]) -> int:
        """Release every leased row below its partition's offset in ``position``; returns how many."""
        released = 0
        with self._cond:
            for lease in list(self._leases):
                released += lease.keep(_at_or_past(lease.keys, lease.offsets, position))
                if not len(lease.offsets):
                    self._leases.remove(lease)
            self._release(released)
        return released

    def expire(self) -> int:
        """Leases past their deadline back to the front of the buffer (oldest first); returns the rows."""
        now, back = time.monotonic(), 0
        with self._cond:
            expired = []
            while self._leases and self._leases[0].deadline <= now:
                expired.append(self._leases.popleft())
            for lease in reversed(expired):
                self._items.appendleft(_Item(lease.batch, lease.keys, lease.offsets))
                back += lease.batch.num_rows
            self._rows += back
            self.served_again += back
            self._release(back)
        return back

    def leased(self) -> int:
        """Rows out with a reader and not acknowledged (after letting expired leases go back)."""
        self.expire()
        return self._held

    def _release(self, rows: int) -> None:
        if rows:
            self._held -= rows
            self._cond.notify_all()

    def clear(self) -> int:
        with self._cond:
            dropped = super().clear() + self._held
            self._leases.clear()
            self._release(self._held)
            return dropped

    def drop(self, partitions: set[str]) -> int:
        with self._cond:
            dropped = super().drop(partitions)
            gone = 0
            for lease in list(self._leases):
                gone += lease.keep(~np.isin(np.asarray(lease.keys, dtype=object), list(partitions)))
                if not len(lease.offsets):
                    self._leases.remove(lease)
            self._release(gone)
            return dropped + gone


def _at_or_past(keys: list[str], offsets: np.ndarray, position: dict[str, int]) -> np.ndarray:
    """Which rows lie at or past their partition's offset in ``position`` (all, where it names none)."""
    if keys[0] == keys[-1] and len(set(keys)) == 1:
        return offsets >= position.get(keys[0], -1)
    limits = np.fromiter((position.get(k, -1) for k in keys), np.int64, len(keys))
    return offsets >= limits
