"""The one sample schema every source decodes into, and the hashing of sparse ids.

A sample row has: the join keys as read (e.g. ``request_id``), the label (float32), the
event timestamp (int64 epoch milliseconds), one int64 per sparse feature already hashed
into ``[0, buckets)``, and one float32 per dense feature.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from primus_lib.spec.job import PrimusJob
from primus_lib.spec.training import FeaturesSpec


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


def hash_buckets(values: pa.Array | np.ndarray, buckets: int) -> np.ndarray:
    """Stable (across processes and hosts) hash of raw ids into ``[0, buckets)``."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        values = values.to_numpy(zero_copy_only=False)
    if values.dtype.kind in "iu":
        hashed = _splitmix64(values.astype(np.uint64, copy=False))
    else:
        hashed = pd.util.hash_array(np.asarray(values, dtype=object))
    return (hashed % np.uint64(buckets)).astype(np.int64)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))
