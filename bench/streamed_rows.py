"""The trainer's per-row id bookkeeping (the once rule and MTRM's validation, ``streamed.py``), from
a minibatch's Arrow id column to its rows found, against a Python dict keyed by the id strings.

Each step of a pair: a stream minibatch of fresh ids is recorded (its labels and the three towers'
logits kept), then a batch minibatch is looked up and its rows forgotten: 90% the copies of rows
streamed about 500,000 rows earlier, shuffled, 10% ids never streamed. Both sides start from
the same steady state (1,100,000 rows recorded into a record of 1,000,000; a long-running job's
after its first million stream rows) and get the same minibatches, as Arrow string columns of
14-character ids (the datagen's).
- ours: ``row_keys`` hashes the column to 64-bit keys in numpy (in the trainer, on the prefetch
  thread), ``StreamedRows`` puts and pops them a minibatch at a time (``key_table.py``, on
  pandas' khash table);
- dict: the column to Python strings (``to_pylist``), a dict of id -> ring position updated
  with ``dict.update(zip(...))`` and popped with ``map(dict.pop, ...)`` (the fastest dict idiom
  we found; the trainer's bookkeeping until 2026-12-04, so this baseline is our own former code
  built on the standard library's hash table, not an outside peer).

Figures (measured; the median of ROUNDS rounds, the two sides interleaved and alternating who goes
first): rows per second through record + take for minibatches of 512, 8,192 (the GPU bench's)
and 65,536 rows, split into conversion and lookup. ``ratio`` is ours / dict in rows per second
at 8,192 rows; ``ratio_512``, ``ratio_65536`` beside it, and ``ratio_512_young``: 512-row
minibatches in a trainer's first 200,000 stream rows, where the dict is small and cheap (the less
favourable case: ours pays a fixed cost per call). Training-thread time only
counts ``lookup``: the conversion runs on the prefetch thread. Last line: one JSON object.
Run: .venv/bin/python bench/streamed_rows.py
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from itertools import islice, repeat
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from primus_lib.train.model.row_keys import row_keys
from primus_lib.train.model.streamed import CAPACITY, StreamedRows
from primus_lib.train.model.validation import Towers

# (name, minibatch rows, rows recorded before the clock, rows between a row's stream and batch copies)
CASES = (
    ("512", 512, 1_100_000, 500_000),
    ("8192", 8192, 1_100_000, 500_000),
    ("65536", 65536, 1_100_000, 500_000),
    ("512_young", 512, 200_000, 100_000),  # a trainer's first 200,000 stream rows: a small dict is cheap
)
ROUNDS = 5
STEPS = {512: 200, 8192: 30, 65536: 6}  # pairs a round
NEVER = 0.1  # share of a batch minibatch that was never streamed


def ids(start: int, n: int) -> pa.Array:
    return pa.array([f"{(start + i) // 100_000:07x}-{(start + i) % 100_000:06x}" for i in range(n)])


class DictRows:
    """The baseline: a dict of id strings -> ring position, the columns as ours."""

    def __init__(self, capacity: int = CAPACITY):
        self.capacity, self.next = capacity, 0
        self.positions: dict[str, int] = {}
        self.columns = {name: np.full(capacity, np.nan, np.float32) for name in ("label", *Towers._fields)}

    def record(self, ids: list[str], labels: np.ndarray, towers: Towers) -> None:
        n = len(ids)
        self.positions.update(zip(ids, range(self.next, self.next + n), strict=True))
        last = np.arange(self.next, self.next + n) % self.capacity
        self.next += n
        self.columns["label"][last] = labels
        for name, logits in zip(Towers._fields, towers, strict=True):
            self.columns[name][last] = logits
        if len(self.positions) > self.capacity:
            for key in list(islice(self.positions, len(self.positions) - self.capacity)):
                del self.positions[key]

    def take(self, ids: list[str]) -> np.ndarray:
        position = np.fromiter(map(self.positions.pop, ids, repeat(-1)), dtype=np.int64, count=len(ids))
        found = position >= max(0, self.next - self.capacity)
        out = np.full(len(ids), np.nan, np.float32)
        out[found] = self.columns["label"][position[found] % self.capacity]
        return out


class Side(Protocol):
    def convert(self, column: pa.Array) -> Any: ...
    def record(self, keys: Any, labels: np.ndarray, towers: Towers) -> None: ...
    def take(self, keys: Any) -> np.ndarray: ...


class Ours:
    def __init__(self) -> None:
        self.rows = StreamedRows(logits=True)

    def convert(self, column: pa.Array) -> np.ndarray:
        return row_keys(column)

    def record(self, keys: np.ndarray, labels: np.ndarray, towers: Towers) -> None:
        self.rows.record(keys, torch.from_numpy(labels))
        self.rows.record_logits(towers)

    def take(self, keys: np.ndarray) -> np.ndarray:
        found = self.rows.take(keys)
        return np.full(len(keys), np.nan, np.float32) if found.labels is None else found.labels.numpy()


class Baseline:
    def __init__(self) -> None:
        self.rows = DictRows()

    def convert(self, column: pa.Array) -> list[str]:
        return column.to_pylist()

    def record(self, ids: list[str], labels: np.ndarray, towers: Towers) -> None:
        self.rows.record(ids, labels, towers)

    def take(self, ids: list[str]) -> np.ndarray:
        return self.rows.take(ids)


def workload(size: int, start: int, lag: int, pairs: int, rng: np.random.Generator) -> list[tuple]:
    """(stream column, labels, the towers' logits, batch column, the batch rows expected found) per pair."""
    out = []
    for _ in range(pairs):
        old = size - int(size * NEVER)
        copies = rng.permutation(np.arange(start - lag, start - lag + old))
        never = np.arange(10**9 + start, 10**9 + start + size - old)
        batch = np.concatenate([copies, never])
        rng.shuffle(batch)
        column = pa.array([f"{b // 100_000:07x}-{b % 100_000:06x}" for b in batch])
        labels = (rng.random(size) < 0.1).astype(np.float32)
        towers = Towers(*(rng.normal(size=size).astype(np.float32) for _ in Towers._fields))
        out.append((ids(start, size), labels, towers, column, old))
        start += size
    return out


def run(side: Side, steps: list[tuple]) -> tuple[float, float]:
    """Seconds converting and seconds looking up, over ``steps``."""
    convert = lookup = 0.0
    for stream, labels, towers, batch, expected in steps:
        t0 = time.perf_counter()
        fresh = side.convert(stream)
        t1 = time.perf_counter()
        side.record(fresh, labels, towers)
        t2 = time.perf_counter()
        old = side.convert(batch)
        t3 = time.perf_counter()
        found = side.take(old)
        t4 = time.perf_counter()
        convert += (t1 - t0) + (t3 - t2)
        lookup += (t2 - t1) + (t4 - t3)
        got = int(np.count_nonzero(~np.isnan(found)))
        if got != expected:
            raise SystemExit(f"{type(side).__name__}: found {got} of a batch minibatch's rows, expected {expected}")
    return convert, lookup


def main() -> None:
    rng = np.random.default_rng(0)
    result: dict = {"bench": "streamed_rows", "capacity": CAPACITY, "id_chars": 14, "rounds": ROUNDS}
    for case, size, fill, lag in CASES:
        sides: dict[str, Side] = {"ours": Ours(), "dict": Baseline()}
        for side in sides.values():
            for start in range(0, fill, 65_536):
                n = min(65_536, fill - start)
                side.record(
                    side.convert(ids(start, n)),
                    np.zeros(n, np.float32),
                    np.zeros(n, np.float32),
                    np.zeros(n, np.float32),
                )
        position = fill
        figures: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
        for r in range(ROUNDS):
            steps = workload(size, position, lag, STEPS[size], rng)
            position += size * STEPS[size]
            order = list(sides) if r % 2 == 0 else list(sides)[::-1]
            for name in order:
                figures[name].append(run(sides[name], steps))
        rows = 2 * size * STEPS[size]
        per: dict = {}
        for name, runs in figures.items():
            total = statistics.median(c + lookup for c, lookup in runs)
            per[name] = {
                "rows_per_s": round(rows / total),
                "lookup_rows_per_s": round(rows / statistics.median(lookup for _, lookup in runs)),
                "convert_us_per_row": round(statistics.median(c for c, _ in runs) / rows * 1e6, 3),
                "lookup_us_per_row": round(statistics.median(lookup for _, lookup in runs) / rows * 1e6, 3),
                "runs_s": [round(c + lookup, 4) for c, lookup in runs],
            }
        ratio = per["ours"]["rows_per_s"] / per["dict"]["rows_per_s"]
        lookup_ratio = per["ours"]["lookup_rows_per_s"] / per["dict"]["lookup_rows_per_s"]
        result[f"rows_{case}"] = {"recorded_before": fill, **per}
        result[f"ratio_{case}"] = round(ratio, 2)
        result[f"ratio_{case}_lookup_only"] = round(lookup_ratio, 2)
        print(
            f"{case:>9} rows: ours {per['ours']['rows_per_s']:,} rows/s, dict {per['dict']['rows_per_s']:,}: {ratio:.2f}x (lookup only {lookup_ratio:.2f}x)",
            file=sys.stderr,
        )
    result["ratio"] = result["ratio_8192"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
