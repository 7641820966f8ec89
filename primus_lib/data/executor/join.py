"""The Joiner's data side: join the staged sources of a window on their keys, fill what the
join left empty, shuffle with a recorded seed, and commit fixed-size Arrow shards.

Deterministic: the staged inputs are read in task order, the join's output is put back in
(left row, right row) order before the seeded shuffle, and every shard is one record batch,
so a re-run of a window yields the same bytes.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from primus_lib.data.dtgg.ops import PartitionNotReady
from primus_lib.data.dtgg.planner import Planner
from primus_lib.data.executor.task import read_staged, staging_dir, staging_path
from primus_lib.data.schema import hash_buckets, job_keys, sample_schema
from primus_lib.data.shards import Manifest, read_manifest, write_window
from primus_lib.data.sources.quality import clean_window
from primus_lib.paths import JobPaths, window_id
from primus_lib.spec.dataset import StreamSpec
from primus_lib.spec.job import PrimusJob
from primus_lib.storage import StorageLocation

_JOIN_TYPES = {"left": "left outer", "inner": "inner", "outer": "full outer"}


class JoinError(ValueError):
    """The staged sources cannot make a full sample (a column nobody provides, a task not run)."""


def window_seed(job: PrimusJob, stream: str, window: str) -> int:
    """The shuffle seed of a window: derived from training.seed, the stream and the window id."""
    digest = hashlib.blake2b(f"{job.spec.training.seed}/{stream}/{window}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def join_window(
    job: PrimusJob, stream_name: str, window_start: datetime, *, timings: dict[str, float] | None = None
) -> Manifest:
    """Join + shuffle + commit the window from the staged outputs of all its tasks (idempotent).

    ``timings``, if given, receives the seconds spent per stage (read, join, shuffle, commit)."""
    lap = _Laps(timings)
    stream = job.stream(stream_name)
    paths = JobPaths.for_job(job)
    directory = paths.window_dir(stream_name, window_start)
    existing = read_manifest(directory)
    if existing is not None:
        return existing
    wid = window_id(window_start)
    plan = Planner(job, stream_name, threads=1).plan_window(window_start)
    if not plan.ready:
        raise PartitionNotReady("; ".join(plan.missing))
    tables: dict[str, list[pa.Table]] = {s.name: [] for s in stream.sources}
    for task in plan.tasks:
        path = staging_path(job, task)
        if not path.exists():
            raise JoinError(
                f"window {wid} of stream {stream_name!r}: task {task.id} has no staged output ({path}); run it first"
            )
        tables[task.source].append(read_staged(path))
    inputs = {name: _concat(parts) for name, parts in tables.items()}
    lap("read")
    table = assemble(job, stream, inputs, wid)
    table, dropped = clean_window(job, stream_name, table, window_start)  # rows of other windows, repeated ids
    lap("join")
    seed = window_seed(job, stream_name, wid)
    table = shuffle(table, seed)
    lap("shuffle")
    extra = {
        "sources": {name: t.num_rows if t is not None else 0 for name, t in inputs.items()},
        "tasks": len(plan.tasks),
        **dropped,
    }
    manifest = write_window(directory, table, stream=stream_name, window=wid, seed=seed,
                            rows_per_shard=stream.rows_per_shard, extra=extra)  # fmt: skip
    staged = staging_dir(job, stream_name, wid)
    if isinstance(staged, StorageLocation):
        staged.delete()  # committed: intermediates go
    else:
        shutil.rmtree(staged, ignore_errors=True)
    lap("commit")
    return manifest


class _Laps:
    """Seconds since the previous lap, added to ``timings[name]`` (a no-op without a dict)."""

    def __init__(self, timings: dict[str, float] | None):
        self.timings = timings
        self.last = time.perf_counter()

    def __call__(self, name: str) -> None:
        if self.timings is not None:
            now = time.perf_counter()
            self.timings[name] = self.timings.get(name, 0.0) + now - self.last
            self.last = now


def _concat(parts: list[pa.Table]) -> pa.Table | None:
    parts = [p for p in parts if p.num_rows or p.num_columns]
    return pa.concat_tables(parts, promote_options="default") if parts else None


def shuffle(table: pa.Table, seed: int) -> pa.Table:
    """One seeded permutation gathered over the whole table, single-chunk columns (one record
    batch per shard)."""
    order = np.random.default_rng(seed).permutation(table.num_rows)
    return table.take(pa.array(order)).combine_chunks()


def assemble(job: PrimusJob, stream: StreamSpec, inputs: dict[str, pa.Table | None], wid: str) -> pa.Table:
    """Join the sources (the first is the left side) and return the full sample schema."""
    schema = sample_schema(job.spec.features, job_keys(job))
    names = [s.name for s in stream.sources]
    table = inputs[names[0]]
    if table is None:
        table = schema.empty_table().select([c for c in schema.names if c in _decodable(job)])
    if stream.join is not None and len(names) > 1:
        keys = stream.join.keys
        how = _JOIN_TYPES[stream.join.how]
        for name in names[1:]:
            right = inputs[name]
            if right is None:
                right = pa.table({k: pa.array([], pa.string()) for k in keys})
            extra = [c for c in right.column_names if c not in table.column_names or c in keys]
            table = _ordered_join(table, right.select(extra), keys, how)
    elif len(names) > 1:
        table = pa.concat_tables([t for t in inputs.values() if t is not None], promote_options="default")
    return _complete(job, stream, table, schema, wid)


def _decodable(job: PrimusJob) -> set[str]:
    return set(job_keys(job)) | set(job.spec.features.columns)


def _ordered_join(left: pa.Table, right: pa.Table, keys: list[str], how: str) -> pa.Table:
    """Join, with rows in (left row, right row) order so the result does not depend on threads."""
    if len(keys) == 1 and how in ("left outer", "inner"):
        lookup = _lookup_join(left, right, keys[0], how)
        if lookup is not None:
            return lookup
    left = left.append_column("__l", pa.array(np.arange(left.num_rows, dtype=np.int64)))
    right = right.append_column("__r", pa.array(np.arange(right.num_rows, dtype=np.int64)))
    joined = left.join(right, keys, join_type=how, use_threads=False, coalesce_keys=True)
    order = pc.sort_indices(joined, sort_keys=[("__l", "ascending", "at_end"), ("__r", "ascending", "at_end")])
    return joined.take(order).drop_columns(["__l", "__r"])


def _lookup_join(left: pa.Table, right: pa.Table, key: str, how: str) -> pa.Table | None:
    """The common case, a right side whose matched keys are unique (clicks per request): one hash
    lookup per left row, left order kept, no sort. None when a matched key repeats on the right
    (then the general join runs)."""
    right_keys = right.column(key).combine_chunks()
    if right_keys.null_count:
        return None
    index = pc.index_in(left.column(key), value_set=right_keys)
    if _matched_key_repeats(right_keys, index):
        return None
    if how == "inner":
        keep = pc.is_valid(index)
        left, index = left.filter(keep), pc.filter(index, keep)
    out = left
    for name in right.column_names:
        if name != key:
            out = out.append_column(right.schema.field(name), pc.take(right.column(name), index))
    return out


def _matched_key_repeats(right_keys: pa.Array, index: pa.Array) -> bool:
    """Whether a right key some left row matched occurs more than once on the right.

    ``index_in`` points every match of a key at one right row with that key, so any other row
    with a matched key is a right row nobody points at; only those rows (usually none: clicks
    without an impression) are looked up among the matched keys, instead of hashing the
    whole right side again to prove it unique."""
    used = np.zeros(len(right_keys), dtype=bool)
    used[pc.drop_null(index).to_numpy()] = True
    if used.all():
        return False
    unused = right_keys.filter(pa.array(~used))
    matched = right_keys.filter(pa.array(used))
    return bool(pc.any(pc.is_in(unused, value_set=matched)).as_py())


def _complete(job: PrimusJob, stream: StreamSpec, table: pa.Table, schema: pa.Schema, wid: str) -> pa.Table:
    features = job.spec.features
    fill = dict(stream.join.fill) if stream.join else {}
    buckets = {f.name: f.buckets for f in features.sparse}
    n = table.num_rows
    columns = []
    for field in schema:
        default = _default(field, fill.get(field.name), buckets.get(field.name))
        if field.name in table.column_names:
            column = table.column(field.name).cast(field.type)
            if column.null_count:
                if default is None:
                    raise JoinError(
                        f"window {wid} of stream {stream.name!r}: column {field.name!r} has empty values and join.fill has none for it"
                    )
                column = pc.fill_null(column, pa.scalar(default, field.type))
        else:
            if default is None or (field.name not in fill and field.name not in features.dense):
                if field.name in job_keys(job) and field.name not in (stream.join.keys if stream.join else []):
                    column = pa.nulls(n, field.type).fill_null("")
                else:
                    raise JoinError(
                        f"window {wid} of stream {stream.name!r}: no source provides column {field.name!r} "
                        f"and join.fill has no value for it"
                    )
            else:
                column = pa.array(np.full(n, default), field.type) if n else pa.array([], field.type)
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)


def _default(field: pa.Field, fill, bucket: int | None):
    """The value for empty cells: join.fill if given (sparse fill ids are hashed), else 0 / ''."""
    if fill is not None:
        if bucket is not None:
            return int(hash_buckets(np.array([fill]), bucket)[0])
        return fill
    if pa.types.is_string(field.type):
        return ""
    return 0
