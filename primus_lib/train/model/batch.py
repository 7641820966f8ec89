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


def to_batch(table: pa.Table | pa.RecordBatch, features: FeaturesSpec, id_column: str | None = None) -> Batch:
    """Build a :class:`Batch`; missing columns are an error that names them."""
    names = table.schema.names  # column_names builds a Field per column: ~10 us a call
    wanted = _wanted(features)
    if not wanted.issubset(names):
        missing = [
            c
            for c in [features.label, features.timestamp, *(f.name for f in features.sparse), *features.dense]
            if c not in names
        ]
        raise ValueError(f"sample table lacks columns {missing} (has {sorted(names)})")
    rows = table.num_rows
    keys = [f.name for f in features.sparse]
    # One copy per output: views of the Arrow buffers are concatenated/stacked straight into the
    # owned arrays torch gets (the per-step cost of this function is per-sample input overhead).
    if keys:
        values = np.concatenate([_view(table, k) for k in keys]).astype(np.int64, copy=False)
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
        dense = np.stack([_view(table, k) for k in features.dense], axis=1).astype(np.float32, copy=False)
    else:
        dense = np.zeros((rows, 0), np.float32)
    sample_ids = sample_keys = None
    if id_column and id_column in names:
        sample_ids = _array(table, id_column)
        # the keys hashed as the rows were read (``row_keys.with_keys``), else now
        sample_keys = _np(table, KEY_COLUMN, np.uint64) if KEY_COLUMN in names else row_keys(sample_ids)
    return Batch(
        sparse=sparse,
        dense=torch.from_numpy(dense),
        labels=torch.from_numpy(_np(table, features.label, np.float32)),
        ts=_np(table, features.timestamp, np.int64),
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


def _np(table: pa.Table | pa.RecordBatch, name: str, dtype: type) -> np.ndarray:
    return np.array(_view(table, name), dtype=dtype, copy=True)
