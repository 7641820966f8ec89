"""Decode a source's raw table into the sample schema's columns (vectorised, no per-row Python).

A source keeps the columns it has among the stream's join keys and the feature columns (a
joined stream gets the full schema from the join); a single-source stream must have them all.
Timestamps become int64 epoch ms, labels float32, sparse raw ids (int or string) are hashed
into their buckets, dense features become float32 with nulls as 0.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from primus_lib.data.schema import hash_buckets, job_keys, sample_schema
from primus_lib.spec.dataset import SourceSpec, StreamSpec
from primus_lib.spec.job import PrimusJob


class DecodeError(ValueError):
    """Raw data that cannot become samples; the message names the file/record and column."""


def column_map(job: PrimusJob, source: SourceSpec) -> dict[str, str]:
    """Sample column -> the column's name in this source (``source.columns`` renames)."""
    names = [*job_keys(job), *job.spec.features.columns]
    return {name: source.columns.get(name, name) for name in names}


def required_columns(job: PrimusJob, stream: StreamSpec, source: SourceSpec) -> list[str]:
    """Sample columns this source must carry: the join keys (joined) or all features (single)."""
    if stream.join is not None and len(stream.sources) > 1:
        return list(dict.fromkeys([*stream.join.keys, *source.columns]))
    features = job.spec.features
    return [
        *(stream.join.keys if stream.join else []),
        features.label,
        features.timestamp,
        *(f.name for f in features.sparse),
        *source.columns,
    ]


def decode(job: PrimusJob, stream: StreamSpec, source: SourceSpec, raw: pa.Table, origin: str) -> pa.Table:
    """``raw`` (as read from ``origin``) -> the sample columns it has, in sample-schema order and types."""
    mapping = column_map(job, source)
    present = set(raw.column_names)
    for name in required_columns(job, stream, source):
        if mapping.get(name, name) not in present:
            raise DecodeError(
                f"{origin}: missing column {mapping.get(name, name)!r} (sample column {name!r}) "
                f"required by source {source.name!r} of stream {stream.name!r}; found {sorted(present)}"
            )
    schema = sample_schema(job.spec.features, job_keys(job))
    features = job.spec.features
    buckets = {f.name: f.buckets for f in features.sparse}
    names = [field.name for field in schema if mapping[field.name] in present]

    def convert(name: str) -> pa.Array | pa.ChunkedArray:
        src, column = mapping[name], raw.column(mapping[name])
        try:
            if name == features.timestamp:
                return to_epoch_ms(column)
            if name in buckets:
                return pa.array(hash_ids(column, buckets[name]), pa.int64())
            if name in features.dense:
                return pc.fill_null(pc.cast(column, pa.float32()), 0.0)
            if name == features.label:
                return pc.cast(column, pa.float32())
            return pc.cast(column, pa.string())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, TypeError, ValueError) as exc:
            raise DecodeError(
                f"{origin}: column {src!r} (sample column {name!r}) expected {schema.field(name).type}: {exc}"
            ) from None

    threads = min(pa.cpu_count(), len(names))
    if threads > 1:  # the allotment's threads: hashing and casts release the GIL
        arrays = list(_pool(threads).map(convert, names))
    else:
        arrays = [convert(name) for name in names]
    fields = [schema.field(n) for n in names]
    return pa.Table.from_arrays([_chunked(a) for a in arrays], schema=pa.schema(fields))


_pools: dict[tuple[int, int], ThreadPoolExecutor] = {}


def _pool(threads: int) -> ThreadPoolExecutor:
    """One pool per thread count, kept: a stream decodes a block every few milliseconds, and a
    pool per block started its threads each time. Keyed by process too: a forked task's copy
    has no threads."""
    key = (os.getpid(), threads)
    pool = _pools.get(key)
    if pool is None:
        pool = _pools.setdefault(key, ThreadPoolExecutor(threads, thread_name_prefix="primus-decode"))
    return pool


def _chunked(array: pa.Array | pa.ChunkedArray) -> pa.ChunkedArray:
    return array if isinstance(array, pa.ChunkedArray) else pa.chunked_array([array])


def hash_ids(column: pa.ChunkedArray | pa.Array, buckets: int) -> np.ndarray:
    """Hash raw ids; integers and integer-valued floats as int64, anything else as strings
    (kept in Arrow: ``hash_buckets`` hashes each distinct string once)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    kind = column.type
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind) or pa.types.is_floating(kind):
        values = pc.fill_null(pc.cast(column, pa.int64()), 0).to_numpy(zero_copy_only=False)
        return hash_buckets(values, buckets)
    if pa.types.is_dictionary(kind):
        if column.null_count == 0 and pa.types.is_string(kind.value_type):
            return hash_buckets(column, buckets)
        return hash_ids(column.dictionary_decode(), buckets)
    return hash_buckets(pc.fill_null(pc.cast(column, pa.string()), ""), buckets)


def to_epoch_ms(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Timestamps as int64 epoch ms from a timestamp type, ISO strings, or int seconds/ms/us/ns.

    Integer units are told apart by magnitude: below 1e11 seconds (until year 5138), below 1e14
    milliseconds, below 1e17 microseconds, else nanoseconds.
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    kind = column.type
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        if pa.types.is_timestamp(kind) and kind.tz is None:
            column = pc.assume_timezone(column, "UTC")
        return pc.cast(pc.cast(column, pa.timestamp("ms", tz="UTC")), pa.int64())
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        parsed = pc.cast(column, pa.timestamp("ms", tz="UTC"))
        return pc.cast(parsed, pa.int64())
    if pa.types.is_floating(kind):
        column = pc.cast(pc.round(column), pa.int64())
    values = pc.cast(column, pa.int64())
    peak = pc.max(pc.abs(values)).as_py() or 0
    if peak < 10**11:
        return pc.multiply(values, 1000)
    if peak < 10**14:
        return values
    if peak < 10**17:
        return pc.divide(values, 1000)
    return pc.divide(values, 1_000_000)


def conform(job: PrimusJob, table: pa.Table) -> pa.Table:
    """The full sample schema for a stream's samples: absent keys become '' and absent dense
    features 0 (label, timestamp and sparse ids are required upstream)."""
    schema = sample_schema(job.spec.features, job_keys(job))
    if table.schema.equals(schema):
        return table
    n = table.num_rows
    columns = []
    for field in schema:
        if field.name in table.column_names:
            columns.append(table.column(field.name))
        elif pa.types.is_string(field.type):
            columns.append(pa.array([""] * n, pa.string()))
        elif field.name in job.spec.features.dense:
            columns.append(pa.array(np.zeros(n, np.float32)))
        else:
            raise DecodeError(f"stream samples lack column {field.name!r} (expected {field.type})")
    return pa.Table.from_arrays(columns, schema=schema)
