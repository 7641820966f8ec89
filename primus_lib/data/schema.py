"""The one sample schema every source decodes into, and the hashing of sparse ids.

A sample row has: the join keys as read (e.g. ``request_id``), the label (float32), the
event timestamp (int64 epoch milliseconds), one int64 per sparse feature already hashed
into ``[0, buckets)``, and one float32 per dense feature.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from primus_lib.spec.job import PrimusJob
from primus_lib.spec.training import FeaturesSpec

RESENT_CLICK_SUFFIX = "+late"
"""A stream event whose key ends with this is a click re-sent after its label window closed (the
impression's features, label 1, the click's time): training data, not an impression to score."""


def sample_schema(features: FeaturesSpec, keys: list[str] | None = None) -> pa.Schema:
    fields = [pa.field(key, pa.string()) for key in keys or []]
    fields.append(pa.field(features.label, pa.float32()))
    fields.append(pa.field(features.timestamp, pa.int64()))
    fields += [pa.field(f.name, pa.int64()) for f in features.sparse]
    fields += [pa.field(name, pa.float32()) for name in features.dense]
    return pa.schema(fields)


def job_keys(job: PrimusJob) -> list[str]:
    """The key columns carried by every sample: the union of the streams' join keys."""
    keys: list[str] = []
    for stream in job.spec.dataset.streams:
        for key in stream.join.keys if stream.join else []:
            if key not in keys:
                keys.append(key)
    if job.spec.features.id and job.spec.features.id not in keys:
        keys.append(job.spec.features.id)
    return keys


def hash_buckets(values: pa.Array | pa.ChunkedArray | np.ndarray, buckets: int) -> np.ndarray:
    """Stable (across processes and hosts) hash of raw ids into ``[0, buckets)``.

    Integers: splitmix64 of the value as uint64, modulo ``buckets``. Strings: pandas'
    ``hash_array`` (SipHash-2-4 of the UTF-8 bytes, fixed key), modulo ``buckets``. An Arrow
    string array is dictionary-encoded first and only its distinct values are hashed (ids repeat
    heavily in CTR logs): the result is bit-identical to hashing every value.
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        if values.null_count == 0 and _is_stringlike(values.type):
            return _hash_strings_by_dictionary(values, buckets)
        values = values.to_numpy(zero_copy_only=False)
    if values.dtype.kind in "iu":
        return _bucket(splitmix64(values), buckets)
    return _bucket(_hash_array(np.asarray(values, dtype=object)), buckets)


def _is_stringlike(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        return _is_stringlike(kind.value_type)
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)


def _hash_strings_by_dictionary(values: pa.Array, buckets: int) -> np.ndarray:
    encoded = values if pa.types.is_dictionary(values.type) else pc.dictionary_encode(values)
    distinct = encoded.dictionary.to_numpy(zero_copy_only=False)
    hashed = _bucket(_hash_array(distinct, categorize=False), buckets)
    return hashed[encoded.indices.to_numpy(zero_copy_only=False)]


def load_string_hashing() -> None:
    """Import what string ids are hashed with now: a long-running stream executor's first rows
    should not wait for pandas' import (0.16 s, bench/stream.py)."""
    _hash_array(np.array(["id"], dtype=object))


def _hash_array(values: np.ndarray, **options) -> np.ndarray:
    """pandas' ``hash_array``, imported on first use: only string ids need it, and a data task's
    process (one per mapped Airflow task) of integer ids should not pay pandas' import."""
    from pandas.util import hash_array

    return hash_array(values, **options)


def _bucket(hashed: np.ndarray, buckets: int) -> np.ndarray:
    """``hashed % buckets`` as int64, in place (a mask when ``buckets`` is a power of two)."""
    if buckets & (buckets - 1) == 0:
        np.bitwise_and(hashed, np.uint64(buckets - 1), out=hashed)
    else:
        np.remainder(hashed, np.uint64(buckets), out=hashed)
    return hashed.view(np.int64)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a fresh uint64 copy, computed in place (no temporaries per step)."""
    z = x.astype(np.uint64, copy=True)
    t = np.empty_like(z)
    with np.errstate(over="ignore"):
        z += np.uint64(0x9E3779B97F4A7C15)
        np.right_shift(z, np.uint64(30), out=t)
        z ^= t
        z *= np.uint64(0xBF58476D1CE4E5B9)
        np.right_shift(z, np.uint64(27), out=t)
        z ^= t
        z *= np.uint64(0x94D049BB133111EB)
        np.right_shift(z, np.uint64(31), out=t)
        z ^= t
    return z
