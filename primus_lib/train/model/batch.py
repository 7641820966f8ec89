"""Sample-schema Arrow tables -> model input (KeyedJaggedTensor + dense + labels).

Buffers own their numpy copies (pandas-3 / Arrow buffers are read-only), so torch gets
writable memory without a warning.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch
from torchrec import KeyedJaggedTensor

from primus_lib.spec.training import FeaturesSpec
from primus_lib.train.model.row_keys import KEY_COLUMN, row_keys


@dataclass
class Batch:
    """One minibatch: one id per sparse feature and row (single-valued features)."""

    sparse: KeyedJaggedTensor
    dense: torch.Tensor  # [B, n_dense] float32, raw values
    labels: torch.Tensor  # [B] float32
    ts: np.ndarray  # [B] int64 epoch ms
    keys: np.ndarray | None = None  # [B] uint64: the rows' sample ids hashed (row_keys.py)
    id_column: pa.Array | None = None  # the sample ids themselves, for the sample log

    @property
    def size(self) -> int:
        return int(self.labels.shape[0])

    @property
    def ids(self) -> list[str] | None:
        """The rows' sample ids as Python values (the sample log's; the trainer's lookups use ``keys``)."""
        return None if self.id_column is None else self.id_column.to_pylist()


@dataclass
class Prepared:
    """A minibatch made ready by the prefetch thread: the step's input, the newest event time
    (the lag gauge) and the rows by window (``WindowAccounting.parts``)."""

    batch: Batch
    newest_ms: int
    parts: list


class Block:
    """A table whose rows become several minibatches (a training buffer's pushed rows): each column
    is converted to numpy once, when a minibatch first needs it, and every minibatch of the table
    slices it. Converting a minibatch's columns one by one was most of building it on the step's
    helper (~20 us a column there, a slice ~0.5 us)."""

    __slots__ = ("table", "names", "_arrays", "_columns")

    def __init__(self, table: pa.Table | pa.RecordBatch):
        self.table = table
        self.names = table.schema.names  # column_names builds a Field per column: ~10 us a call
        self._arrays: dict[str, pa.Array] = {}
        self._columns: dict[str, np.ndarray] = {}

    def array(self, name: str) -> pa.Array:
        found = self._arrays.get(name)
        if found is None:  # threads may both convert it: the same array either way
            found = self._arrays[name] = _array(self.table, name)
        return found

    def column(self, name: str) -> np.ndarray:
        found = self._columns.get(name)
        if found is None:
            found = self._columns[name] = _view(self.table, name)
        return found


class Cut:
    """Rows ``start:start + num_rows`` of a :class:`Block`, read by :func:`to_batch` as a table's."""

    __slots__ = ("block", "start", "num_rows")

    def __init__(self, block: Block, start: int = 0, num_rows: int | None = None):
        self.block, self.start = block, start
        self.num_rows = block.table.num_rows - start if num_rows is None else num_rows

    def view(self, name: str) -> np.ndarray:
        return self.block.column(name)[self.start : self.start + self.num_rows]

    def array(self, name: str) -> pa.Array:
        return self.block.array(name).slice(self.start, self.num_rows)

    def copy(self, name: str, dtype: type) -> np.ndarray:
        return np.array(self.view(name), dtype=dtype, copy=True)


def to_batch(rows: pa.Table | pa.RecordBatch | Cut, features: FeaturesSpec, id_column: str | None = None) -> Batch:
    """Build a :class:`Batch` from a table or a :class:`Cut` of one; missing columns are an error that names them."""
    cut = rows if isinstance(rows, Cut) else Cut(Block(rows))
    names = cut.block.names
    wanted = _wanted(features)
    if not wanted.issubset(names):
        missing = [
            c
            for c in [features.label, features.timestamp, *(f.name for f in features.sparse), *features.dense]
            if c not in names
        ]
        raise ValueError(f"sample table lacks columns {missing} (has {sorted(names)})")
    rows = cut.num_rows
    keys = [f.name for f in features.sparse]
    # One copy per output: views of the Arrow buffers are concatenated/stacked straight into the
    # owned arrays torch gets (the per-step cost of this function is per-sample input overhead).
    if keys:
        values = np.concatenate([cut.view(k) for k in keys]).astype(np.int64, copy=False)
    else:
        values = np.zeros(0, np.int64)
    # Single-valued features: lengths, offsets and the per-key splits are known, so the KJT is
    # built complete (from_lengths_sync would derive them with a cumsum and list conversions).
    n = rows * len(keys)
    lengths, offsets = _single_valued(n)
    sparse = KeyedJaggedTensor(
        keys=keys,
        values=torch.from_numpy(values),
        lengths=lengths,
        offsets=offsets,
        stride=rows,
        length_per_key=[rows] * len(keys),
        offset_per_key=list(range(0, n + 1, rows)) if rows else [0] * (len(keys) + 1),
    )
    if features.dense:
        dense = np.stack([cut.view(k) for k in features.dense], axis=1).astype(np.float32, copy=False)
    else:
        dense = np.zeros((rows, 0), np.float32)
    sample_ids = sample_keys = None
    if id_column and id_column in names:
        sample_ids = cut.array(id_column)
        # the keys hashed as the rows were read (``row_keys.with_keys``), else now
        sample_keys = cut.copy(KEY_COLUMN, np.uint64) if KEY_COLUMN in names else row_keys(sample_ids)
    return Batch(
        sparse=sparse,
        dense=torch.from_numpy(dense),
        labels=torch.from_numpy(cut.copy(features.label, np.float32)),
        ts=cut.copy(features.timestamp, np.int64),
        keys=sample_keys,
        id_column=sample_ids,
    )


@functools.lru_cache(maxsize=4)
def _single_valued(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The lengths (ones) and offsets (0..n) of ``n`` single-valued ids, made once per size and shared by
    every minibatch of it: TorchRec and fbgemm only read them (a bounds check rewrites an offset only where
    it is invalid). Two tensors fewer a minibatch: each torch call on the step's helper hands the GIL to
    the training thread and waits to get it back (30-40 us each there, profiled; ~3 us alone)."""
    return torch.ones(n, dtype=torch.int64), torch.arange(n + 1, dtype=torch.int64)


_WANTED: dict[int, tuple[FeaturesSpec, frozenset[str]]] = {}


def _wanted(features: FeaturesSpec) -> frozenset[str]:
    """The columns a batch needs, once per (frozen) features spec: this runs every step."""
    known = _WANTED.get(id(features))
    if known is None or known[0] is not features:
        columns = frozenset([features.label, features.timestamp, *(f.name for f in features.sparse), *features.dense])
        known = _WANTED[id(features)] = (features, columns)
    return known[1]


def _array(table: pa.Table | pa.RecordBatch, name: str) -> pa.Array:
    """The column as one array: its only chunk as it is, else the chunks combined."""
    column = table.column(name)
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return column


def _view(table: pa.Table | pa.RecordBatch, name: str) -> np.ndarray:
    """The column as numpy: zero-copy (read-only) when it has no nulls and one chunk."""
    column = _array(table, name)
    if column.null_count:
        column = column.fill_null(0)
    return column.to_numpy(zero_copy_only=False)
