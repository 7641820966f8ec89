"""A hash table of 64-bit row keys to positions, probed a minibatch at a time in numpy.

The once rule and MTRM's validation look every row of every minibatch up by its sample id. A
Python dict of a million id strings costs about 0.55 us a row (a few cache misses each, on the
training thread): 50 ms for a 65,536-row minibatch's record and lookup on a 2-core dev machine,
where a GPU host's whole step took 17.5-20 ms (docs/status.md). Here the ids are hashed once per
minibatch (``row_keys.py``) and a whole minibatch is put, found or popped by a few array
operations: about 0.13 us a row, but about 0.1 ms a call, so a small dict stays cheaper at
512-row minibatches (``bench/streamed_rows.py``).

Layout: buckets of ``SLOTS`` slots, a bucket's keys and positions side by side in one 64-byte
cache line, so a probe costs one miss. A key lives in its home bucket (``key & mask``) or, when
that was full as it arrived, in the next ones; a bucket passed that way is marked ``overflow``
(a byte a bucket: the marks stay in cache), and a lookup stops at the first unmarked bucket. A
slot is free when its position is below ``floor``: never used, popped, or older than the caller's
window (the ring of ``StreamedRows`` wrote over it); free slots are reused in place. The table is
rebuilt only to grow, or to clear marks once one bucket in 16 carries one; with the live keys at
most half the slots, full buckets (and marks) are rare.
"""

from __future__ import annotations

import numpy as np

SLOTS = 4  # a bucket's keys and positions fill 64 bytes; _slot assumes 4
EMPTY = -1  # the position of a slot never used
POPPED = -2  # the position of a slot whose key was popped
ABSENT = -1  # the position ``pop`` gives a key it does not hold
_LINE = 2 * SLOTS  # int64 cells a bucket


class KeyTable:
    """uint64 key -> int64 position (>= 0); positions below ``floor`` are dead."""

    def __init__(self, buckets: int = 64):
        self.floor = 0
        self._allocate(buckets)

    def _allocate(self, buckets: int) -> None:
        self.mask = buckets - 1
        cells = np.empty(buckets * _LINE + 8, np.int64)
        skip = (-cells.ctypes.data % 64) // 8  # buckets on cache-line boundaries
        self.cells = cells[skip : skip + buckets * _LINE].reshape(buckets, _LINE)
        self.cells[:, :SLOTS] = 0
        self.cells[:, SLOTS:] = EMPTY
        self.overflow = np.zeros(buckets, bool)  # a key whose walk passed this bucket lives further on
        self.claims = np.empty(buckets * SLOTS, np.int32)  # scratch: who won a contested slot
        self.bound = 0  # at least the live keys: the exact count is taken when this nears the limit

    @property
    def slots(self) -> int:
        return self.claims.size

    def __len__(self) -> int:
        return int(np.count_nonzero(self.cells[:, SLOTS:] >= self.floor))

    def put(self, keys: np.ndarray, positions: np.ndarray) -> None:
        """Map each key to its position (a key given again keeps its largest position; a position
        below ``floor`` is dead on arrival)."""
        alive = positions >= self.floor
        if not alive.all():
            keys, positions = keys[alive], positions[alive]
        if not len(keys):
            return
        if (self.bound + len(keys)) * 2 > self.slots:
            self._resize(len(keys))
        self._put(keys.view(np.int64), positions)

    def pop(self, keys: np.ndarray) -> np.ndarray:
        """Each key's position (``ABSENT`` where it is not held), forgetting the keys found. A key
        asked twice is found at its first occurrence."""
        out = np.full(len(keys), ABSENT, np.int64)
        if not len(keys):
            return out
        where = self._find(keys.view(np.int64))
        rows = np.flatnonzero(where >= 0)
        if len(rows):
            slot = _slot(where[rows])
            self.claims[slot] = rows
            first = self.claims[slot] == rows
            if not first.all():  # a key asked twice: its first asker gets it
                np.minimum.at(self.claims, slot, rows)
                first = self.claims[slot] == rows
            rows = rows[first]
            at = where[rows] + SLOTS
            cells = self.cells.ravel()
            out[rows] = cells[at]
            cells[at] = POPPED
        return out

    def live(self) -> tuple[np.ndarray, np.ndarray]:
        """Every live key (uint64) and its position, in table order."""
        alive = self.cells[:, SLOTS:] >= self.floor
        return self.cells[:, :SLOTS][alive].view(np.uint64), self.cells[:, SLOTS:][alive]

    def _find(self, keys: np.ndarray) -> np.ndarray:
        """Each key's live slot as the flat index of its key cell, -1 where it has none."""
        out = np.full(len(keys), -1, np.int64)
        todo, wanted, bucket = np.arange(len(keys)), keys, keys & self.mask
        while len(todo):
            rows = np.take(self.cells, bucket, axis=0)
            hit = rows[:, :SLOTS] == wanted[:, None]
            hit &= rows[:, SLOTS:] >= self.floor
            hits = _packed(hit)
            found = hits != 0
            if found.any():
                out[todo[found]] = bucket[found] * _LINE + _first(hits[found])
            going = ~found & np.take(self.overflow, bucket)
            todo, wanted, bucket = todo[going], wanted[going], (bucket[going] + 1) & self.mask
        return out

    def _put(self, keys: np.ndarray, positions: np.ndarray) -> None:
        """One walk a key from its home bucket: a live slot of the key takes the new position; else
        the first free slot on the way, once an unmarked bucket shows the key is nowhere further.
        Keys contesting a slot: one wins it, the others walk again from home (a copy of the
        winner's key then finds it and keeps the larger position)."""
        cells = self.cells.ravel()
        home = keys & self.mask
        todo, bucket = np.arange(len(keys), dtype=np.int32), home.copy()
        spare = np.full(len(keys), -1, np.int64)  # per key: the first free key cell on its walk
        while len(todo):
            rows = np.take(self.cells, bucket, axis=0)
            at = rows[:, SLOTS:]
            mine = rows[:, :SLOTS] == keys[todo][:, None]
            mine &= at >= self.floor
            mines = _packed(mine)
            same = mines != 0
            if same.any():  # the key put again (or twice in this call): its latest position
                np.maximum.at(cells, bucket[same] * _LINE + SLOTS + _first(mines[same]), positions[todo[same]])
            frees = _packed(at < self.floor)
            cell = spare[todo]
            first_free = (cell < 0) & (frees != 0)
            cell[first_free] = bucket[first_free] * _LINE + _first(frees[first_free])
            spare[todo] = cell
            passing = ~same & (cell < 0)  # no free slot here nor before: the key will live further on
            self.overflow[bucket[passing]] = True
            ready = ~same & ~np.take(self.overflow, bucket)  # nowhere further: it takes its spare cell
            cell, claimants = cell[ready], todo[ready]
            still = cells[cell + SLOTS] < self.floor  # a spare seen rounds ago may have been taken since
            slot = _slot(cell[still])
            self.claims[slot] = claimants[still]
            won = np.zeros(len(claimants), bool)
            won[still] = self.claims[slot] == claimants[still]
            cell, winners = cell[won], claimants[won]
            cells[cell], cells[cell + SLOTS] = keys[winners], positions[winners]
            self.bound += len(winners)
            lost = claimants[~won]  # from home again
            spare[lost] = -1
            going = ~same & ~ready
            bucket[going] = (bucket[going] + 1) & self.mask
            bucket[ready] = home[todo[ready]]
            keep = going
            keep[np.flatnonzero(ready)[~won]] = True
            todo, bucket = todo[keep], bucket[keep]

    def _resize(self, arriving: int) -> None:
        """Count the live keys; rebuild (dropping the dead slots and the marks) when they and those
        arriving would fill over a third of the slots (then grown to at most a quarter), or when one
        bucket in 16 is marked."""
        live = len(self)
        self.bound = live
        buckets = self.mask + 1
        if (live + arriving) * 3 <= self.slots and np.count_nonzero(self.overflow) * 16 <= buckets:
            return
        while (live + arriving) * 4 > buckets * SLOTS:
            buckets *= 2
        keys, positions = self.live()
        self._allocate(buckets)
        if len(keys):
            self._put(keys.view(np.int64), positions)


_LOWEST = np.array([1, 1 << 8, 1 << 16, 1 << 24], np.uint32)  # a bucket's slot j as the lowest set bit


def _packed(mask: np.ndarray) -> np.ndarray:
    """A row's 4 booleans as one little-endian uint32 (0: none set): one operation, not a reduction."""
    return np.ascontiguousarray(mask).view("<u4").ravel()


def _first(packed: np.ndarray) -> np.ndarray:
    """The first set slot of each (non-zero) packed row."""
    lowest = packed & (~packed + np.uint32(1))
    return np.searchsorted(_LOWEST, lowest)


def _slot(cell: np.ndarray) -> np.ndarray:
    """The slot number (bucket * SLOTS + slot) of a key cell's flat index."""
    return (cell >> 3) * SLOTS + (cell & 7)
