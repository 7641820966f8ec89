"""The Joiner's data side: join the staged sources of a window on their keys, fill what the
join left empty, shuffle with a recorded seed, and commit fixed-size Arrow shards.

Deterministic: the staged inputs are read in task order, the join's output is put back in
(left row, right row) order before the seeded shuffle, and every shard is one record batch,
so a re-run of a window yields the same bytes.
"""

from __future__ import annotations

import hashlib
import time
from concurrent.futures import ThreadPoolExecutor
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
        try:  # read, not asked for first: on S3 an existence check is a request of its own
            tables[task.source].append(read_staged(path))
        except FileNotFoundError:
            raise JoinError(
                f"window {wid} of stream {stream_name!r}: task {task.id} has no staged output ({path}); run it first"
            ) from None
    inputs = {name: _concat(parts) for name, parts in tables.items()}
    lap("read")
    seed = window_seed(job, stream_name, wid)
    first = inputs[stream.sources[0].name]
    with ThreadPoolExecutor(1, thread_name_prefix="primus-shuffle") as spare:
        # with a second thread, the left side's part of the result (a left join keeps its rows in
        # order) is cleaned, permuted and gathered while the join probes the right side
        early = (
            spare.submit(_left_part, job, stream, first, wid, window_start, seed)
            if pa.cpu_count() > 1 and _speculate(job, stream, first)
            else None
        )
        view = joined_view(job, stream, inputs, wid, probe_threads=1 if early else None)
        guess = early.result() if early is not None else None
        if guess is not None and view.left_intact:
            rows, dropped, order, gathered = guess
        else:
            rows, dropped = _kept_rows(job, stream_name, view, window_start)  # rows of other windows, repeated ids
            order, gathered = _permutation(seed, view.rows if rows is None else len(rows)), {}
        lap("join")
    table = view.materialize(order if rows is None else rows[order], gathered)  # == shuffle(clean(join)), one take
    lap("shuffle")
    extra = {
        "sources": {name: t.num_rows if t is not None else 0 for name, t in inputs.items()},
        "tasks": len(plan.tasks),
        **dropped,
    }
    manifest = write_window(
        directory, table, stream=stream_name, window=wid, seed=seed, rows_per_shard=stream.rows_per_shard, extra=extra
    )
    staging_dir(job, stream_name, wid).delete()  # committed: intermediates go
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


def _speculate(job: PrimusJob, stream: StreamSpec, first: pa.Table | None) -> bool:
    """Whether the left side alone decides the kept rows and its columns: a left join of several
    sources whose first source has the columns ``clean_window`` checks."""
    if first is None or stream.join is None or len(stream.sources) < 2 or stream.join.how != "left":
        return False
    features = job.spec.features
    return all(name in first.column_names for name in (features.timestamp, features.id) if name)


def _left_part(job: PrimusJob, stream: StreamSpec, first: pa.Table, wid: str, start: datetime, seed: int) -> tuple:
    """What ``join_window`` would compute from the left side of a left join that keeps its rows in
    order: the kept rows, their counts, the seeded order and the left columns gathered in it."""
    view = JoinedView(job, stream, wid, first.num_rows)
    view.columns = {c: (first.column(c), None) for c in first.column_names if c in view.schema.names}
    rows, dropped = _kept_rows(job, stream.name, view, start)
    order = _permutation(seed, view.rows if rows is None else len(rows))
    taken = order if rows is None else rows[order]
    return rows, dropped, order, {name: view.gather(name, taken) for name in view.columns}


def _concat(parts: list[pa.Table]) -> pa.Table | None:
    parts = [p for p in parts if p.num_rows or p.num_columns]
    return pa.concat_tables(parts, promote_options="default") if parts else None


def shuffle(table: pa.Table, seed: int) -> pa.Table:
    """One seeded permutation gathered over the whole table, single-chunk columns (one record
    batch per shard). ``join_window`` gathers the same rows straight from the staged inputs."""
    return table.take(pa.array(_permutation(seed, table.num_rows))).combine_chunks()


def _permutation(seed: int, rows: int) -> np.ndarray:
    """``default_rng(seed).permutation(rows)``, drawn on int32 when it fits: the same shuffle
    (the same random draws), half the memory to swap in and to read in every take (-10 ms / 1 M)."""
    if rows >= 2**31:
        return np.random.default_rng(seed).permutation(rows)
    order = np.arange(rows, dtype=np.int32)
    np.random.default_rng(seed).shuffle(order)
    return order


class JoinedView:
    """The join's result without copying it: every output column is a source column plus, for the
    right side, the matched right row of each output row. Only the rows that survive the window's
    checks are ever gathered (``materialize``: one take per column, in the order asked for, the
    columns on ``pa.cpu_count()`` threads), cast to the sample schema and filled."""

    def __init__(self, job: PrimusJob, stream: StreamSpec, wid: str, rows: int) -> None:
        self.schema = sample_schema(job.spec.features, job_keys(job))
        self.fill = dict(stream.join.fill) if stream.join else {}
        self.buckets = {f.name: f.buckets for f in job.spec.features.sparse}
        self.stream, self.wid, self.rows = stream.name, wid, rows
        self.columns: dict[str, tuple[pa.ChunkedArray, pa.Array | None]] = {}  # name -> (values, right row)
        self.constant: dict[str, object] = {}  # columns no source has: one value everywhere
        self.left_intact = False  # the left source's rows, in order, are the view's rows

    def column(self, name: str, rows: np.ndarray | None = None) -> pa.Array | pa.ChunkedArray:
        """Sample column ``name`` for the output rows ``rows`` (all of them when None)."""
        field = self.schema.field(name)
        if name in self.constant:
            n = self.rows if rows is None else len(rows)
            return pa.array(np.full(n, self.constant[name]), field.type) if n else pa.array([], field.type)
        values, index = self.columns[name]
        values = values.chunk(0) if values.num_chunks == 1 else values.combine_chunks()  # a take over chunks: 2x
        if index is None:
            column = values if rows is None else values.take(pa.array(rows))
            return self._filled(name, column.cast(field.type))
        # a right-side column: its values cast and filled once, the fill value appended at the end,
        # where the rows without a match point: one take, no null handling per output row
        values = self._filled(name, values.cast(field.type))
        default = _default(field, self.fill.get(name), self.buckets.get(name))
        values = pa.concat_arrays([values, pa.array([default], field.type)])
        index = pc.fill_null(index, len(values) - 1)
        return values.take(index if rows is None else index.take(pa.array(rows)))

    def _filled(self, name: str, column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        if not column.null_count:
            return column
        field = self.schema.field(name)
        default = _default(field, self.fill.get(name), self.buckets.get(name))
        if default is None:
            raise JoinError(
                f"window {self.wid} of stream {self.stream!r}: column {name!r} has empty values "
                "and join.fill has none for it"
            )
        return pc.fill_null(column, pa.scalar(default, field.type))

    def gather(self, name: str, rows: np.ndarray) -> pa.Array:
        column = self.column(name, rows)
        return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column

    def materialize(self, rows: np.ndarray, gathered: dict[str, pa.Array] | None = None) -> pa.Table:
        """The sample table of ``rows``; ``gathered`` holds columns already gathered in that order."""
        gathered = gathered or {}
        names = [n for n in self.schema.names if n not in gathered]
        threads = min(pa.cpu_count(), len(names))
        if threads > 1:
            with ThreadPoolExecutor(threads, thread_name_prefix="primus-join") as pool:
                columns = list(pool.map(lambda name: self.gather(name, rows), names))
        else:
            columns = [self.gather(name, rows) for name in names]
        gathered = {**gathered, **dict(zip(names, columns, strict=True))}
        return pa.Table.from_arrays([gathered[n] for n in self.schema.names], schema=self.schema)


def joined_view(
    job: PrimusJob, stream: StreamSpec, inputs: dict[str, pa.Table | None], wid: str, probe_threads: int | None = None
) -> JoinedView:
    """Join the sources (the first is the left side) into a view of the full sample schema.
    ``probe_threads``: threads for the key lookups (default ``pa.cpu_count()``)."""
    names = [s.name for s in stream.sources]
    table = inputs[names[0]]
    if table is None:
        table = sample_schema(job.spec.features, job_keys(job)).empty_table()
        table = table.select([c for c in table.column_names if c in _decodable(job)])
    right_columns: dict[str, tuple[pa.ChunkedArray, pa.Array]] = {}
    if stream.join is not None and len(names) > 1:
        keys, how = stream.join.keys, _JOIN_TYPES[stream.join.how]
        for name in names[1:]:
            right = inputs[name]
            if right is None:
                right = pa.table({k: pa.array([], pa.string()) for k in keys})
            extra = [c for c in right.column_names if c not in table.column_names or c in keys]
            right = right.select(extra)
            found = (
                _lookup_index(table, right, keys[0], how, probe_threads)
                if len(keys) == 1 and not right_columns
                else None
            )
            if found is None:  # the general join: materialised, earlier lookups included
                table = _ordered_join(_materialize_right(table, right_columns), right, keys, how)
                right_columns = {}
                continue
            left_rows, index = found
            if left_rows is not None:
                table = table.take(pa.array(left_rows))
            right_columns = {c: (right.column(c), index) for c in right.column_names if c != keys[0]}
    elif len(names) > 1:
        table = pa.concat_tables([t for t in inputs.values() if t is not None], promote_options="default")
    view = JoinedView(job, stream, wid, table.num_rows)
    view.left_intact = table is inputs[names[0]]
    view.columns = {c: (table.column(c), None) for c in table.column_names}
    view.columns.update(right_columns)
    _check_complete(job, stream, view)
    return view


def _materialize_right(table: pa.Table, right_columns: dict[str, tuple[pa.ChunkedArray, pa.Array]]) -> pa.Table:
    for name, (values, index) in right_columns.items():
        table = table.append_column(name, values.take(index))
    return table


def _check_complete(job: PrimusJob, stream: StreamSpec, view: JoinedView) -> None:
    """Every sample column comes from a source or from a default (join.fill, a dense 0, an empty key)."""
    features = job.spec.features
    for field in view.schema:
        if field.name in view.columns:
            continue
        default = _default(field, view.fill.get(field.name), view.buckets.get(field.name))
        if default is None or (field.name not in view.fill and field.name not in features.dense):
            if field.name in job_keys(job) and field.name not in (stream.join.keys if stream.join else []):
                view.constant[field.name] = ""
                continue
            raise JoinError(
                f"window {view.wid} of stream {stream.name!r}: no source provides column {field.name!r} "
                "and join.fill has no value for it"
            )
        view.constant[field.name] = default


def _kept_rows(job: PrimusJob, stream: str, view: JoinedView, start: datetime) -> tuple[np.ndarray | None, dict]:
    """The view's rows that ``clean_window`` keeps (in order; None: all) and its counts: it sees
    only the columns it checks (timestamp, sample id) plus each row's number."""
    features = job.spec.features
    narrow = {"__view_row": pa.array(np.arange(view.rows, dtype=np.int64))}
    for name in dict.fromkeys([features.timestamp, features.id]):
        if name and name in view.schema.names:
            narrow[name] = view.column(name)
    kept, dropped = clean_window(job, stream, pa.table(narrow), start)
    return (None if kept.num_rows == view.rows else kept.column("__view_row").to_numpy()), dropped


def _decodable(job: PrimusJob) -> set[str]:
    return set(job_keys(job)) | set(job.spec.features.columns)


def _ordered_join(left: pa.Table, right: pa.Table, keys: list[str], how: str) -> pa.Table:
    """Join, with rows in (left row, right row) order so the result does not depend on threads."""
    if len(keys) == 1 and how in ("left outer", "inner"):
        found = _lookup_index(left, right, keys[0], how)
        if found is not None:
            left_rows, index = found
            out = left if left_rows is None else left.take(pa.array(left_rows))
            for name in right.column_names:
                if name != keys[0]:
                    out = out.append_column(right.schema.field(name), pc.take(right.column(name), index))
            return out
    left = left.append_column("__l", pa.array(np.arange(left.num_rows, dtype=np.int64)))
    right = right.append_column("__r", pa.array(np.arange(right.num_rows, dtype=np.int64)))
    joined = left.join(right, keys, join_type=how, use_threads=False, coalesce_keys=True)
    order = pc.sort_indices(joined, sort_keys=[("__l", "ascending", "at_end"), ("__r", "ascending", "at_end")])
    return joined.take(order).drop_columns(["__l", "__r"])


def _lookup_index(
    left: pa.Table, right: pa.Table, key: str, how: str, threads: int | None = None
) -> tuple[np.ndarray | None, pa.Array] | None:
    """The common case, a right side whose matched keys are unique (clicks per request): one hash
    lookup per left row, left order kept, no sort. Returns (the left rows kept: None for all, the
    right row of each, null where none); None when a matched key repeats on the right (then the
    general join runs)."""
    if left.num_rows == 0 and how == "left outer":
        return None, pa.array([], pa.int32())
    right_keys = right.column(key).combine_chunks()
    if right_keys.null_count:
        return None
    index = _index_in(left.column(key), right_keys, threads)
    if _matched_key_repeats(right_keys, index):
        return None
    if how == "inner":
        keep = pc.is_valid(index)
        return np.flatnonzero(keep.to_numpy(zero_copy_only=False)), pc.drop_null(index)
    return None, index


def _index_in(keys: pa.ChunkedArray, value_set: pa.Array, threads: int | None = None) -> pa.Array:
    """``pc.index_in`` as one array; with several CPU threads the probes of the left chunks run in
    parallel (each probe is one hash lookup per row; Arrow releases the GIL). Each call hashes
    ``value_set`` again (half the work for 1 M x 300 k keys), so ``join_window`` gives the probe
    one thread when the other has work of its own."""
    chunks = keys.chunks if isinstance(keys, pa.ChunkedArray) else [keys]
    threads = min(pa.cpu_count() if threads is None else threads, len(chunks))
    if threads > 1:
        step = -(-len(chunks) // threads)
        groups = [pa.chunked_array(chunks[i : i + step], keys.type) for i in range(0, len(chunks), step)]
        with ThreadPoolExecutor(threads, thread_name_prefix="primus-join") as pool:
            parts = list(pool.map(lambda g: pc.index_in(g, value_set=value_set), groups))
        return pa.chunked_array([c for p in parts for c in p.chunks], pa.int32()).combine_chunks()
    index = pc.index_in(keys, value_set=value_set)
    return index.combine_chunks() if isinstance(index, pa.ChunkedArray) else index


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


def _default(field: pa.Field, fill, bucket: int | None):
    """The value for empty cells: join.fill if given (sparse fill ids are hashed), else 0 / ''."""
    if fill is not None:
        if bucket is not None:
            return int(hash_buckets(np.array([fill]), bucket)[0])
        return fill
    if pa.types.is_string(field.type):
        return ""
    return 0
