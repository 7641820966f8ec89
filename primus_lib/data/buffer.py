"""The in-memory sample buffer between stream runners and a trainer: bounded, thread-safe.

Producers ``put`` Arrow record batches (blocking while the buffer is full: backpressure);
the trainer ``pop``s a given number of rows, stitched from one or more batches. Each batch
may carry the source offsets of its rows, so ``consumed_position()`` tells exactly which
offsets the popped rows cover: that is what a checkpoint stores and later commits.
``len()`` and ``utilisation`` feed the scaling metrics.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import pyarrow as pa


class BufferClosed(RuntimeError):
    pass


@dataclass
class _Item:
    batch: pa.RecordBatch
    keys: list[str] | None  # partition of each row
    offsets: np.ndarray | None  # source offset of each row
    start: int = 0  # rows of this batch already popped


class SampleBuffer:
    def __init__(self, capacity_rows: int):
        if capacity_rows <= 0:
            raise ValueError(f"capacity_rows must be positive, got {capacity_rows}")
        self.capacity = capacity_rows
        self._items: deque[_Item] = deque()
        self._rows = 0
        self._cond = threading.Condition()
        self._closed = False
        self._consumed: dict[str, int] = {}
        self._held = 0  # rows popped but still counted against the capacity (a stream executor's leases)
        self.rows_in = 0
        self.rows_out = 0

    def __len__(self) -> int:
        return self._rows

    @property
    def utilisation(self) -> float:
        """Fill level in [0, 1] (an empty buffer means the trainer outruns its data executors)."""
        return min(1.0, self._rows / self.capacity)

    def put(
        self, batch: pa.RecordBatch, offsets: tuple[list[str], np.ndarray] | None = None, timeout: float | None = None
    ) -> bool:
        """Add a batch; blocks while full. False on timeout. A batch larger than the capacity is admitted alone."""
        if batch.num_rows == 0:
            return True
        keys, offs = offsets if offsets is not None else (None, None)
        if offs is not None and len(offs) != batch.num_rows:
            raise ValueError(f"{len(offs)} offsets for {batch.num_rows} rows")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._rows + self._held > 0 and self._rows + self._held + batch.num_rows > self.capacity:
                if self._closed:
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            if self._closed:
                raise BufferClosed("sample buffer closed")
            self._items.append(_Item(batch, keys, offs))
            self._rows += batch.num_rows
            self.rows_in += batch.num_rows
            self._cond.notify_all()
            return True

    def pop(self, rows: int, timeout: float | None = None, partial: bool = True) -> pa.RecordBatch | None:
        """Up to ``rows`` rows (exactly ``rows`` unless ``partial`` and the wait timed out); None if none."""
        popped = self.pop_tagged(rows, timeout, partial)
        return None if popped is None else popped[0]

    def pop_tagged(
        self, rows: int, timeout: float | None = None, partial: bool = True
    ) -> tuple[pa.RecordBatch, list[str], np.ndarray] | None:
        """As ``pop``, with the partition and source offset of every row (empty when the batches
        carried none): what a stream executor hands out over Flight with the rows."""
        if rows <= 0:
            raise ValueError(f"pop: rows must be positive, got {rows}")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._rows < rows and not self._closed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left)
            if self._rows == 0 or (self._rows < rows and not partial):
                return None
            parts = []
            keys: list[str] = []
            offs: list[np.ndarray] = []
            need = rows
            while need > 0 and self._items:
                item = self._items[0]
                take = min(need, item.batch.num_rows - item.start)
                parts.append(item.batch.slice(item.start, take))
                if item.offsets is not None and item.keys is not None:
                    keys += item.keys[item.start : item.start + take]
                    offs.append(item.offsets[item.start : item.start + take])
                    self._advance(keys[-take:], offs[-1])
                item.start += take
                need -= take
                if item.start >= item.batch.num_rows:
                    self._items.popleft()
            got = rows - need
            self._rows -= got
            self.rows_out += got
            self._cond.notify_all()
        offsets = np.concatenate(offs) if offs else np.empty(0, np.int64)
        if len(parts) == 1:
            return parts[0], keys, offsets
        return pa.Table.from_batches(parts).combine_chunks().to_batches()[0], keys, offsets

    def _advance(self, keys: list[str], offsets: np.ndarray) -> None:
        for key, high in _per_key(keys, offsets, np.max).items():
            self._consumed[key] = high + 1

    def pending_start(self) -> dict[str, int]:
        """Per partition, the smallest source offset among rows still waiting in the buffer."""
        out: dict[str, int] = {}
        with self._cond:
            for item in self._items:
                if item.keys is None or item.offsets is None:
                    continue
                for key, low in _per_key(item.keys[item.start :], item.offsets[item.start :], np.min).items():
                    out[key] = min(out.get(key, low), low)
        return out

    def consumed_position(self) -> dict[str, int]:
        """Per partition, the offset just past the last popped row (what a checkpoint may commit)."""
        with self._cond:
            return dict(self._consumed)

    def clear(self) -> int:
        """Drop every waiting row (a stream executor rewinding its reader); returns how many."""
        with self._cond:
            dropped = self._rows
            self._items.clear()
            self._rows = 0
            self._cond.notify_all()
            return dropped

    def drop(self, partitions: set[str]) -> int:
        """Drop the waiting rows of ``partitions`` (a stream executor no longer serving them);
        returns how many. Rows without partitions stay."""
        with self._cond:
            dropped, kept = 0, deque[_Item]()
            for item in self._items:
                if item.keys is None or item.offsets is None:
                    kept.append(item)
                    continue
                names = np.asarray(item.keys[item.start :], dtype=object)
                keep = ~np.isin(names, list(partitions))
                gone = len(keep) - int(keep.sum())
                if gone == 0:
                    kept.append(item)
                    continue
                dropped += gone
                if gone < len(keep):
                    rows = np.flatnonzero(keep)
                    batch = item.batch.slice(item.start).take(pa.array(rows))
                    kept.append(
                        _Item(batch, [item.keys[item.start + i] for i in rows], item.offsets[item.start :][rows])
                    )
            self._items = kept
            self._rows -= dropped
            self._cond.notify_all()
            return dropped

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed


def past(keys: list[str], offsets: np.ndarray) -> dict[str, int]:
    """Per partition, the offset just past its rows among ``keys``/``offsets``."""
    return {key: high + 1 for key, high in _per_key(keys, offsets, np.max).items()}


def _per_key(keys: list[str], offsets: np.ndarray, reduce) -> dict[str, int]:
    """``reduce`` (min/max) of the offsets of each partition among ``keys``."""
    if not keys:
        return {}
    if keys[0] == keys[-1] and len(set(keys)) == 1:  # the usual case: one partition per batch
        return {keys[0]: int(reduce(offsets))}
    names = np.asarray(keys, dtype=object)
    return {key: int(reduce(offsets[names == key])) for key in set(keys)}
