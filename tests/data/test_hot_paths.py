"""The fast paths of the data executor give the same results as the straightforward ones."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from primus_lib.data.dtgg import plan_source
from primus_lib.data.executor import execute_task, join_window
from primus_lib.data.executor.join import _ordered_join, joined_view, shuffle, window_seed
from primus_lib.data.executor.task import read_staged, staging_path
from primus_lib.data.schema import hash_buckets
from primus_lib.data.shards import read_window
from primus_lib.data.sources.decode import hash_ids
from primus_lib.paths import JobPaths, window_id
from tests.data.helpers import T0, write_layout
from tests.fixtures.specs import demo_doc, load

MASK = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """The reference finaliser, one Python int at a time."""
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


@pytest.mark.parametrize("buckets", [1, 2, 1000, 100_000, 1 << 20, (1 << 40) + 7])
def test_int_hashing_is_splitmix64_modulo_buckets(buckets):
    values = np.array([0, 1, -1, 5, 2**63 - 1, -(2**63), 123456789], dtype=np.int64)
    expected = [splitmix64(int(v) & MASK) % buckets for v in values]
    assert hash_buckets(values, buckets).tolist() == expected
    assert hash_buckets(pa.array(values), buckets).tolist() == expected
    assert hash_buckets(values.astype(np.uint64), buckets).tolist() == expected
    assert hash_buckets(values, buckets).dtype == np.int64


def test_string_hashing_by_dictionary_equals_hashing_every_value():
    rng = np.random.default_rng(1)
    raw = [f"user-{v}" for v in rng.integers(0, 40, 3000)] + ["", "é漢字", "x" * 300]
    for buckets in (7, 1024, 100_000):
        direct = (pd.util.hash_array(np.array(raw, dtype=object)) % np.uint64(buckets)).astype(np.int64)
        array = pa.array(raw)
        for variant in (
            array,
            array.cast(pa.large_string()),
            array.dictionary_encode(),
            pa.chunked_array([array[:100], array[100:]]),
            np.array(raw, dtype=object),
        ):
            got = hash_buckets(variant, buckets)
            assert got.tolist() == direct.tolist(), (buckets, getattr(variant, "type", "numpy"))


def test_hash_ids_string_columns_with_nulls_hash_them_as_empty_strings():
    column = pa.array(["a", None, "b", "a"])
    expected = hash_buckets(np.array(["a", "", "b", "a"], dtype=object), 1000)
    assert hash_ids(column, 1000).tolist() == expected.tolist()
    assert hash_ids(column.dictionary_encode(), 1000).tolist() == expected.tolist()
    ints = pa.array([3, None, 4])
    assert hash_ids(ints, 1000).tolist() == hash_buckets(np.array([3, 0, 4]), 1000).tolist()


def test_shuffle_equals_one_take_of_the_whole_table_in_single_chunks():
    part = pa.table({"k": [f"r{i}" for i in range(50)], "v": np.arange(50, dtype=np.int64)})
    table = pa.concat_tables([part, part.slice(10, 20), part])
    out = shuffle(table, seed=42)
    order = np.random.default_rng(42).permutation(table.num_rows)
    assert out.equals(table.take(pa.array(order)).combine_chunks())
    assert all(column.num_chunks == 1 for column in out.columns)
    assert shuffle(table, seed=42).equals(out) and not shuffle(table, seed=43).equals(out)


def test_stage_timings_are_reported_for_the_real_pipeline(tmp_path):
    write_layout(tmp_path / "data", hours=1, rows=50, files=2)
    job = load(demo_doc(f"file://{tmp_path / 'data'}", hours=1, rows_per_shard=100), storage=tmp_path / "jobs")
    timings: dict[str, float] = {}
    for source in ("impressions", "clicks"):
        for task in plan_source(job, "history", source, T0):
            execute_task(job, task, timings=timings)
    manifest = join_window(job, "history", T0, timings=timings)
    assert manifest.rows == 100
    assert set(timings) == {"read_decode", "stage", "metrics", "read", "join", "shuffle", "commit"}
    assert all(seconds > 0 for seconds in timings.values())  # every phase was timed


def _general_join(left: pa.Table, right: pa.Table, how: str) -> pa.Table:
    left = left.append_column("__l", pa.array(np.arange(left.num_rows)))
    right = right.append_column("__r", pa.array(np.arange(right.num_rows)))
    joined = left.join(right, "k", join_type=how, use_threads=False, coalesce_keys=True)
    order = pa.compute.sort_indices(joined, sort_keys=[("__l", "ascending"), ("__r", "ascending")])
    return joined.take(order).drop_columns(["__l", "__r"])


@pytest.mark.parametrize("how", ["left outer", "inner"])
@pytest.mark.parametrize(
    "right_keys",
    [
        ["b", "d", "a"],  # unique, all matched
        ["b", "zz", "a", "yy"],  # unique, some never matched
        ["b", "zz", "zz", "a"],  # a repeated key nobody matches: the lookup stays exact
        ["b", "a", "zz", "b"],  # a repeated matched key: both right rows must come out
        [],
    ],
)
def test_lookup_join_equals_the_general_join(how, right_keys):
    left = pa.table({"k": ["a", "b", "c", "b", None], "x": [1, 2, 3, 4, 5]})
    right = pa.table({"k": pa.array(right_keys, pa.string()), "y": np.arange(len(right_keys), dtype=np.int64)})
    assert _ordered_join(left, right, ["k"], how).equals(_general_join(left, right, how))


@contextmanager
def arrow_threads(threads: int) -> Iterator[None]:
    """Arrow's CPU pool at ``threads`` (as an executor's allotment sets it), restored after."""
    saved = pa.cpu_count()
    pa.set_cpu_count(threads)
    try:
        yield
    finally:
        pa.set_cpu_count(saved)


def run_tasks(job) -> None:
    """Every data task of the window, staged (what the join reads)."""
    for source in ("impressions", "clicks"):
        for task in plan_source(job, "history", source, T0):
            execute_task(job, task)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("files", [1, 3])
def test_a_window_commits_the_same_bytes_at_any_thread_count(tmp_path, threads, files):
    """The joined view gathers the shuffled rows straight from the staged inputs (one chunk or
    many, columns on several threads): the shards equal shuffle(join) of the same inputs."""
    write_layout(tmp_path / "data", hours=1, rows=300, files=files)
    job = load(
        demo_doc(f"file://{tmp_path / 'data'}", hours=1, rows_per_shard=100), storage=tmp_path / f"j{threads}" / "jobs"
    )
    with arrow_threads(threads):
        run_tasks(job)
        inputs = {
            source: pa.concat_tables(
                [read_staged(staging_path(job, t)) for t in plan_source(job, "history", source, T0)]
            )
            for source in ("impressions", "clicks")
        }
        stream = job.stream("history")
        view = joined_view(job, stream, inputs, window_id(T0))
        expected = shuffle(view.materialize(np.arange(view.rows)), window_seed(job, "history", window_id(T0)))
        manifest = join_window(job, "history", T0)
    table = read_window(JobPaths.for_job(job).window_dir("history", T0))
    assert manifest.rows == 300 * files and table.equals(expected)
    assert table.column("clicked").null_count == 0 and 0 < pa.compute.sum(table.column("clicked")).as_py() < 300 * files


@pytest.mark.parametrize("repeat", [False, True])
@pytest.mark.parametrize("sample_id", [None, "request_id"])
def test_the_left_side_gathered_during_the_join_gives_the_one_thread_bytes(tmp_path, repeat, sample_id):
    """With 2 threads the left side is cleaned, permuted and gathered while the join probes the
    clicks: late rows are dropped the same way, and a repeated matched click (the general join,
    the early work thrown away) still commits the bytes of a 1-thread run."""
    import pyarrow.parquet as pq

    data = tmp_path / "data"
    write_layout(data, hours=1, rows=300, files=1)
    hour = f"{T0:%Y%m%d}/{T0:%H}/part-000.parquet"
    imp = pq.read_table(data / "impressions" / hour)
    ts = imp.column("ts").to_numpy().copy()
    ts[-5:] += 7_200_000  # the last five rows two hours late (the repeated click is an early one)
    pq.write_table(imp.set_column(imp.schema.get_field_index("ts"), "ts", pa.array(ts)), data / "impressions" / hour)
    if repeat:
        clk = pq.read_table(data / "clicks" / hour)
        pq.write_table(pa.concat_tables([clk, clk.slice(0, 1)]), data / "clicks" / hour)
    doc = demo_doc(f"file://{data}", hours=1, rows_per_shard=100)
    doc["spec"]["features"]["id"] = sample_id
    runs = {}
    for threads in (1, 2):
        job = load(doc, storage=tmp_path / f"j{threads}" / "jobs")
        with arrow_threads(threads):
            run_tasks(job)
            manifest = join_window(job, "history", T0)
        runs[threads] = ([s.sha256 for s in manifest.shards], manifest.rows, manifest.extra["dropped"])
    expected = {"outside_window": 5, **({"duplicate_id": 1} if repeat and sample_id else {})}
    assert runs[1] == runs[2] and runs[1][2] == expected
    assert runs[1][1] == 295 + (1 if repeat and not sample_id else 0)
