"""A ring's index: 64-bit row keys to the positions the ring holds them at, a minibatch at a time.

The once rule and MTRM's validation look every row of every minibatch up by its sample id. The
ids are hashed once per minibatch (``row_keys.py``); the keys go to the khash table that pandas'
own indexes and ``factorize`` are built on (``pandas._libs.hashtable.Int64HashTable``: C, a whole
array a call). Beside it the table keeps, per ring slot, the key and the position it holds: a
slot written over, or popped, shows it there, so a pop reads the hash table once and never
writes it (khash has no delete reachable from Python). Dead keys stay in the hash table until it
holds twice the ring, then it is rebuilt from the ring.

It replaced a numpy table of cache-line buckets, which paid about 0.1 ms of numpy calls a
minibatch: record + take of a 512-row minibatch in a full record went from 0.36 to 0.20 us a row
(a dict of the id strings: 0.46-0.48), 8,192 rows from 0.12-0.13 to 0.10, and 65,536 rows stayed
at 0.12-0.13 (``bench/streamed_rows.py``, 2026-12-05).
"""

from __future__ import annotations

import numpy as np
from pandas._libs.hashtable import Int64HashTable

ABSENT = -1  # the position ``pop`` gives a key it does not hold (also khash's "not found")


class KeyTable:
    """uint64 key -> int64 position for a ring of ``capacity`` slots: position ``p`` lives in slot
    ``p % capacity`` until ``floor`` (set by the ring) passes it. Positions only grow."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.floor = 0
        self._keys = np.zeros(capacity, np.int64)  # per slot: the key given with its position
        self._positions = np.full(capacity, ABSENT, np.int64)  # per slot: the position given
        self._popped = np.zeros(capacity, bool)  # per slot: its key was popped
        self._claims = np.zeros(capacity, np.int32)  # scratch: which row of a pop gets a slot
        self._index = Int64HashTable()

    def __len__(self) -> int:
        return len(self._live()[0])

    @property
    def entries(self) -> int:
        """Keys in the hash table, live or dead (what its memory grows with)."""
        return len(self._index)

    def put(self, keys: np.ndarray, positions: np.ndarray) -> None:
        """Map each key to its position (a key given twice: its last); a position below ``floor``
        is dead on arrival."""
        alive = positions >= self.floor
        if not alive.all():
            keys, positions = keys[alive], positions[alive]
        if not len(keys):
            return
        if len(self._index) + len(keys) > 2 * self.capacity:
            self._rebuild()
        keys = np.ascontiguousarray(keys).view(np.int64)
        positions = np.ascontiguousarray(positions, np.int64)
        slots = positions % self.capacity
        self._keys[slots], self._positions[slots], self._popped[slots] = keys, positions, False
        self._index.map_keys_to_values(keys, positions)

    def pop(self, keys: np.ndarray) -> np.ndarray:
        """Each key's position (``ABSENT`` where it is not held), forgetting the keys found. A key
        asked twice is found at its first occurrence."""
        out = np.full(len(keys), ABSENT, np.int64)
        if not len(keys):
            return out
        held = self._index.lookup(np.ascontiguousarray(keys).view(np.int64))
        rows = np.flatnonzero(held >= self.floor)
        slots = held[rows] % self.capacity
        live = (self._positions[slots] == held[rows]) & ~self._popped[slots]  # not written over nor popped
        rows, slots = rows[live], slots[live]
        self._claims[slots] = rows
        first = self._claims[slots] == rows
        if not first.all():  # a key asked twice: its first asker gets it
            np.minimum.at(self._claims, slots, rows)
            first = self._claims[slots] == rows
            rows, slots = rows[first], slots[first]
        out[rows] = held[rows]
        self._popped[slots] = True
        return out

    def live(self) -> tuple[np.ndarray, np.ndarray]:
        """Every live key (uint64) and its position, in ring order."""
        keys, positions = self._live()
        return keys.view(np.uint64), positions

    def _live(self) -> tuple[np.ndarray, np.ndarray]:
        alive = (self._positions >= self.floor) & ~self._popped
        keys, positions = self._keys[alive], self._positions[alive]
        alive = self._index.lookup(keys) == positions  # the key not given again since
        return keys[alive], positions[alive]

    def _rebuild(self) -> None:
        """A new hash table of the ring's slots above ``floor``, oldest first: a key given twice
        maps to its last position, popped or not (an earlier one must not come back)."""
        start = self.floor % self.capacity
        order = np.r_[start : self.capacity, 0:start]
        keys, positions = self._keys[order], self._positions[order]
        alive = positions >= self.floor
        keys, positions = keys[alive], positions[alive]
        self._index = Int64HashTable(2 * self.capacity)  # sized for what it holds at the next rebuild
        self._index.map_keys_to_values(keys, positions)
