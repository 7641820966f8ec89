"""``shuffle: rebalance`` in a stream executor: one lane (a bounded buffer) per trainer rank.

In forward mode rank r of n pulls only its own executors' partitions, so a rank whose
partitions carry little data starves the synchronous step of every rank. In rebalance mode
every rank pulls from every executor, from its own lane, and the executor spreads each fetched
batch over the lanes: the row at offset o of a partition goes to lane ``o % n`` (round-robin
over a partition's rows, and the same lane whenever the row is read again, so each offset has
one rank). Within a fetched batch (the bounded shuffle window, ``--poll-rows`` messages) the
rows of different partitions are interleaved at random; a partition's own rows keep their
order, which is what lets each rank's reader drop replays by offset.

Exactly once: each rank's position names, per partition, the offset just past its own lane's
last row (its lane mark). A rewind (a rank's ``seek``) goes back to the lowest offset any
attached lane still needs, so no lane loses a row; a lane's reader drops what it has seen.
Kafka gets, per partition, the lowest offset over the ranks' commits, once every rank has
committed it: below it every lane's rows were trained. Each lane hands its rows out under a lease
(``leases.py``): rows its rank took but never acknowledged are served to that lane again.
"""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa

from primus_lib.data.buffer import past
from primus_lib.data.executor.leases import LEASE_SECONDS, LeasedBuffer

Tagged = tuple[pa.RecordBatch, list[str], np.ndarray]


def interleave(keys: list[str], rng: np.random.Generator) -> np.ndarray:
    """A random order of the rows that keeps each partition's rows in their order: random
    draws, sorted within each partition, then all rows ordered by their draw."""
    draws = rng.random(len(keys))
    names = np.asarray(keys, dtype=object)
    for key in set(keys):
        rows = np.flatnonzero(names == key)
        draws[rows] = np.sort(draws[rows])
    return np.argsort(draws, kind="stable")


class Lanes:
    def __init__(self, capacity_rows: int, lanes: int = 1, seed: int = 0, hold: float = LEASE_SECONDS):
        self.capacity_rows, self.hold = capacity_rows, hold
        self.rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self.reset(lanes)

    def reset(self, lanes: int) -> None:
        """``lanes`` empty lanes (the trainer's world size changed: nothing is kept)."""
        if lanes < 1:
            raise ValueError(f"lanes must be >= 1, got {lanes}")
        old = getattr(self, "buffers", [])
        with self._lock:
            self.count = lanes
            self.buffers = [LeasedBuffer(max(1, self.capacity_rows // lanes), self.hold) for _ in range(lanes)]
            self.marks: dict[int, dict[str, int]] = {}  # lane -> partition -> the next offset it still needs
            self.commits: dict[int, dict[str, int]] = {}  # lane -> partition -> its rank's last commit
        for buffer in old:
            buffer.close()

    def __len__(self) -> int:
        return sum(len(b) for b in self.buffers)

    @property
    def rows_in(self) -> int:
        return sum(b.rows_in for b in self.buffers)

    def split(self, batch: pa.RecordBatch, keys: list[str], offsets: np.ndarray) -> list[tuple[int, Tagged]]:
        """The lanes' shares of a fetched batch, each interleaved across partitions."""
        order = interleave(keys, self.rng)
        lane = offsets[order] % self.count
        out = []
        for index in range(self.count):
            rows = order[lane == index]
            if len(rows):
                out.append((index, (batch.take(pa.array(rows)), [keys[i] for i in rows], offsets[rows])))
        return out

    def put(self, lane: int, piece: Tagged, timeout: float) -> bool:
        batch, keys, offsets = piece
        return self.buffers[lane].put(batch, (keys, offsets), timeout=timeout)

    def _lane(self, lane: int) -> LeasedBuffer:
        if not 0 <= lane < self.count:
            raise ValueError(f"lane {lane} of {self.count}: the reader's rank is out of range")
        return self.buffers[lane]

    def pop(self, lane: int, rows: int, timeout: float) -> Tagged | None:
        """Rows of lane ``lane``, leased to its reader until it acknowledges them (``ack``)."""
        got = self._lane(lane).lease(rows, timeout)
        if got is not None:
            with self._lock:
                self.marks.setdefault(lane, {}).update(past(got[1], got[2]))
        return got

    def ack(self, lane: int, position: dict[str, int]) -> int:
        return self._lane(lane).ack(position)

    def leased(self) -> int:
        return sum(b.leased() for b in self.buffers)

    def rewind_to(self, lane: int, wanted: dict[str, int], fallback: dict[str, int]) -> dict[str, int]:
        """Lane ``lane`` (re)attaches wanting ``wanted``: the offsets to read again from, the
        lowest any attached lane still needs (``fallback``: the committed/startup offsets)."""
        with self._lock:
            # every mark it names: where a partition gained later starts for this lane
            self.marks.setdefault(lane, {}).update({**wanted, **{k: wanted.get(k, v) for k, v in fallback.items()}})
            return {k: min(m.get(k, v) for m in self.marks.values()) for k, v in fallback.items()}

    def start_of(self, key: str, fallback: int) -> int:
        """Where a gained partition starts: the lowest offset an attached lane still needs."""
        with self._lock:
            return min([m.get(key, fallback) for m in self.marks.values()] or [fallback])

    def committable(self, lane: int, position: dict[str, int]) -> dict[str, int]:
        """Record rank ``lane``'s commit; the offsets every lane has committed past (their minimum)."""
        with self._lock:
            self.commits.setdefault(lane, {}).update(position)
            if len(self.commits) < self.count:
                return {}
            return {
                k: min(self.commits[i][k] for i in range(self.count))
                for k in position
                if all(k in self.commits.get(i, {}) for i in range(self.count))
            }

    def clear(self) -> int:
        return sum(b.clear() for b in self.buffers)

    def drop(self, partitions: set[str]) -> int:
        return sum(b.drop(partitions) for b in self.buffers)

    def close(self) -> None:
        for buffer in self.buffers:
            buffer.close()
