from __future__ import annotations

import itertools
import json
import os
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devstack.http_latency import HttpLatencyProxy
from devstack.tcp_proxy import TcpProxy
from primus_lib.data.dtgg import DataTask, PartitionNotReady, Planner, plan_source, source_ready
from primus_lib.data.dtgg import timer as timer_op
from primus_lib.data.dtgg.listing import FileEntry, FusedLister
from primus_lib.data.dtgg.naive import naive_plan
from primus_lib.data.dtgg.ops import DataSourceOp
from primus_lib.data.dtgg.planner import LISTED_AHEAD
from primus_lib.data.ledger import TaskLedger
from primus_lib.data.sources.files import read_task
from primus_lib.paths import JobPaths
from tests.data.helpers import T0, impressions, write_layout
from tests.fixtures.specs import demo_doc, load, write_spec


@pytest.fixture
def layout(tmp_path):
    write_layout(tmp_path / "data", hours=6, rows=20, files=3)
    return tmp_path


def _job(tmp_path, hours=6, **source_overrides):
    doc = demo_doc(f"file://{tmp_path}/data", hours=hours, rows_per_shard=100)
    for source in doc["spec"]["dataset"]["streams"][0]["sources"]:
        source.update(source_overrides)
    return load(doc, storage=tmp_path / "jobs")


def test_dtgg_plans_the_same_tasks_as_the_naive_planner_with_fewer_listings(layout):
    job = _job(layout)
    planner = Planner(job, "history", threads=2, ledger=False)
    plans = list(planner.plan())
    naive = list(naive_plan(job, "history"))
    assert [p.window for p in plans] == [p.window for p in naive] == [f"20261101T{h:02d}0000Z" for h in range(6)]
    assert [p.tasks for p in plans] == [p.tasks for p in naive]
    assert all(len(p.tasks) == 6 for p in plans)  # 3 impression + 3 click files, marker excluded
    # data/, then impressions/ and clicks/ (pruning), then one walk of each day dir that holds
    # the wanted partitions: 5 listings for 2 sources x 6 windows (naive: 24 requests)
    assert planner.listings == 5


def test_restarted_planner_resumes_from_the_ledger_without_listing(layout):
    job = _job(layout)
    first = Planner(job, "history", threads=2, chunk_windows=2)
    planned = list(itertools.islice(first.plan(), 4))  # "crash" after 4 windows
    assert first.stats["windows_planned"] == 4 and len(planned) == 4
    ledger = TaskLedger(JobPaths.for_job(job).ledger)
    assert ledger.planned_windows("history") == [p.window for p in planned]
    second = Planner(job, "history", threads=2)
    again = list(second.plan())
    assert [p.cached for p in again] == [True] * 4 + [False] * 2
    assert [p.tasks for p in again[:4]] == [p.tasks for p in planned]
    assert second.stats["windows_cached"] == 4
    third = Planner(job, "history", threads=2)
    assert all(p.cached for p in third.plan()) and third.listings == 0
    assert ledger.counts("history")["pending"] == 36


def test_missing_marker_is_a_clear_error_naming_the_partition(layout):
    (layout / "data" / "clicks" / "20261101" / "03" / "_SUCCESS").unlink()
    job = _job(layout)
    with pytest.raises(
        PartitionNotReady,
        match=r"source 'clicks' window 20261101T030000Z: partition file://.*/clicks/20261101/03/ incomplete or late \(success marker '_SUCCESS' not found\)",
    ):
        list(Planner(job, "history", ledger=False).plan())
    plans = list(Planner(job, "history", ledger=False).plan(strict=False))
    assert [p.ready for p in plans] == [True, True, True, False]
    ready, missing = source_ready(job, "history", "clicks", T0 + timedelta(hours=3))
    assert not ready and "clicks/20261101/03/" in missing
    assert source_ready(job, "history", "impressions", T0 + timedelta(hours=3)) == (True, None)
    with pytest.raises(PartitionNotReady, match="clicks"):
        plan_source(job, "history", "clicks", T0 + timedelta(hours=3))
    assert len(plan_source(job, "history", "impressions", T0 + timedelta(hours=3))) == 3


def test_without_marker_readiness_follows_window_end_plus_lag(tmp_path):
    write_layout(tmp_path / "data", hours=2, rows=5, files=1, marker=False)
    job = _job(tmp_path, hours=3, success_marker=None)
    lag = job.stream("history").lag
    at = T0 + timedelta(hours=1) + lag
    plans = list(Planner(job, "history", ledger=False, now=at).plan(strict=False))
    assert [p.ready for p in plans] == [True, False]
    assert "not due until" in plans[1].missing[0]
    later = list(Planner(job, "history", ledger=False, now=at + timedelta(days=2)).plan(strict=False))
    assert [p.ready for p in later] == [True, True, False]
    assert "missing (directory not found)" in later[2].missing[0]


def test_split_bytes_splits_parquet_by_row_groups_and_reads_every_row_once(tmp_path):
    hour = tmp_path / "data" / "impressions" / "20261101" / "00"
    hour.mkdir(parents=True)
    table = impressions(T0, 5000, seed=1)
    pq.write_table(table, hour / "big.parquet", row_group_size=500)
    (hour / "_SUCCESS").touch()
    clicks = tmp_path / "data" / "clicks" / "20261101" / "00"
    clicks.mkdir(parents=True)
    pq.write_table(pa.table({"request_id": ["x"], "clicked": [1]}), clicks / "c.parquet")
    (clicks / "_SUCCESS").touch()
    size = (hour / "big.parquet").stat().st_size
    job = _job(tmp_path, hours=1, split_bytes=size // 4)
    tasks = plan_source(job, "history", "impressions", T0)
    assert len(tasks) >= 4 and {t.splits for t in tasks} == {len(tasks)}
    read = [read_task(job, t) for t in tasks]
    ids = [r for t in read for r in t.column("request_id").to_pylist()]
    assert sorted(ids) == sorted(table.column("request_id").to_pylist())
    assert sum(1 for t in read if t.num_rows) >= 3  # the splits really share the work


def test_data_task_round_trips_through_json():
    task = DataTask("i", "s", "src", "20261101T000000Z", "s3://b/k", "b/k", "parquet", 10, 0, 5, 0, 2)
    assert DataTask.from_json(json.dumps(task.to_dict())) == task
    with pytest.raises(ValueError, match="unknown fields"):
        DataTask.from_dict({**task.to_dict(), "bogus": 1})


def test_timer_is_endless_for_an_open_range(tmp_path):
    job = load(demo_doc(f"file://{tmp_path}/data", hours=None, rows_per_shard=100), storage=tmp_path / "jobs")
    starts = list(itertools.islice(timer_op.windows(job), 1000))
    assert starts[0] == T0 and starts[-1] == T0 + timedelta(hours=999)
    assert list(timer_op.windows(job, T0 + timedelta(minutes=30), T0 + timedelta(hours=3))) == [
        T0 + timedelta(hours=1),
        T0 + timedelta(hours=2),
    ]


def test_parallel_generation_keeps_time_order_over_chunks(layout):
    job = _job(layout)
    planner = Planner(job, "history", threads=4, ledger=False, chunk_windows=4)
    windows = [p.start for p in planner.plan()]
    assert windows == sorted(windows) and len(windows) == 6
    assert planner.listings == 10  # the same 5 fused listings per chunk


def test_on_hdfs_every_partition_is_listed_once_and_threads_do_not_change_the_plan(hdfs_cluster, tmp_path):
    write_layout(tmp_path / "local", hours=4, rows=10, files=3)
    base = f"/dtgg-{uuid.uuid4().hex[:8]}/data"
    hdfs_cluster.put(tmp_path / "local", base)
    hdfs_cluster.write_bytes(f"{base}/clicks/20261101/01/_temporary/0/part-9.parquet", b"partial")
    job = load(demo_doc(hdfs_cluster.uri(base), hours=4, rows_per_shard=100), storage=tmp_path / "jobs")
    naive = [p.tasks for p in naive_plan(job, "history")]
    planners = {n: Planner(job, "history", threads=n, ledger=False) for n in (1, 3, 8)}
    plans = {n: [p.tasks for p in planner.plan()] for n, planner in planners.items()}
    assert plans[1] == plans[3] == plans[8] == naive
    assert [len(t) for t in naive] == [6, 6, 6, 6]  # 3 files x 2 sources; markers and _temporary/ left out
    assert {p.listings for p in planners.values()} == {8}  # one LISTSTATUS per partition (naive: 2 requests each)
    assert naive[1][3].uri == f"{hdfs_cluster.uri(base)}/clicks/20261101/01/part-000.parquet"


def test_listing_threads_default_to_sixteen_whatever_the_environment_says(layout, monkeypatch):
    job = _job(layout)
    monkeypatch.setenv("PRIMUS_DTGG_THREADS", "3")  # no longer read: a behaviour of the call, not of the host
    assert Planner(job, "history", ledger=False).threads == 16
    assert Planner(job, "history", threads=1, ledger=False).threads == 1


def test_plan_cli_prints_json(layout, capsys, monkeypatch):
    from primus_lib.cli.main import main

    doc = demo_doc(f"file://{layout}/data", hours=6, rows_per_shard=100, storage={"root": str(layout / "jobs")})
    spec = write_spec(layout / "job.yaml", doc)
    code = main(["plan", str(spec), "--start", "2026-11-01T01:00:00Z", "--end", "2026-11-01T03:00:00Z", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [w["window"] for w in out["windows"]] == ["20261101T010000Z", "20261101T020000Z"]
    assert out["windows"][0]["tasks"] == 6 and out["complete"] is True


def test_any_split_size_reads_every_row_group_exactly_once(tmp_path):
    hour = tmp_path / "data" / "impressions" / "20261101" / "00"
    hour.mkdir(parents=True)
    table = impressions(T0, 700, seed=2)
    pq.write_table(table, hour / "f.parquet", row_group_size=64)
    size = (hour / "f.parquet").stat().st_size
    ids = sorted(table.column("request_id").to_pylist())

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.integers(min_value=200, max_value=size + 100))
    def check(split: int) -> None:
        job = _job(tmp_path, hours=1, split_bytes=split)
        stream = job.stream("history")
        op = DataSourceOp(job, stream, stream.sources[0])
        part = op.partition(T0)
        tasks = op.tasks(T0, part, [FileEntry("f.parquet", size)])
        got = sorted(r for t in tasks for r in read_task(job, t).column("request_id").to_pylist())
        assert got == ids

    check()


def test_pipelined_webhdfs_listings_answer_each_directory_in_order(hdfs_cluster):
    from fsspec.implementations.webhdfs import WebHDFS

    from primus_lib.data.dtgg.webhdfs import PIPELINE, WebHdfsLister

    base = f"/dtgg-pipe-{uuid.uuid4().hex[:8]}"
    wanted, expected = [], {}
    for i in range(PIPELINE + 8):  # more than one pipelined batch, absent directories in between
        directory = f"{base}/day {i:02d}/"
        wanted.append(directory)
        if i % 4 == 3:
            expected[directory] = None
            continue
        hdfs_cluster.mkdir(directory)
        expected[directory] = []
        if i % 5 == 0:
            hdfs_cluster.write_bytes(f"{directory}part 0%.parquet", b"abc")
            hdfs_cluster.mkdir(f"{directory}_temporary/0")  # a subdirectory is not a file
            expected[directory] = [FileEntry("part 0%.parquet", 3)]
    lister = WebHdfsLister(hdfs_cluster.filesystem())
    assert lister.list_dirs(wanted) == expected
    assert lister.list_dir(wanted[0]) == expected[wanted[0]]  # the kept-alive connection again
    # A connection cut after ~1.5 KB of answers (mid-answer): the unanswered rest is resent.
    cutter = TcpProxy(hdfs_cluster.port, cut_after=1500)
    try:
        cut = WebHdfsLister(WebHDFS(hdfs_cluster.host, port=cutter.port, user=hdfs_cluster.user))
        assert cut.list_dirs(wanted) == expected
        assert cutter.connections > 2
    finally:
        cutter.close()


def _hdfs_dirs(hdfs_cluster, count: int) -> tuple[list[str], dict]:
    """``count`` directories, every other one absent, one file in each present one."""
    base = f"/dtgg-lat-{uuid.uuid4().hex[:8]}"
    wanted = [f"{base}/d{i:02d}/" for i in range(count)]
    for directory in wanted[::2]:
        hdfs_cluster.write_bytes(f"{directory}part-0.parquet", b"x")
    expected = {d: [FileEntry("part-0.parquet", 1)] if i % 2 == 0 else None for i, d in enumerate(wanted)}
    return wanted, expected


def _lister_through(hdfs_cluster, proxy):
    from fsspec.implementations.webhdfs import WebHDFS

    from primus_lib.data.dtgg.webhdfs import WebHdfsLister

    return WebHdfsLister(WebHDFS(hdfs_cluster.host, port=proxy.port, user=hdfs_cluster.user))


def test_latency_proxy_delays_every_request_even_pipelined_ones(hdfs_cluster):
    """The per-request model: N pipelined requests on one connection cost N delays (a delay per
    TCP chunk, the old model, let a pipelined batch pay one)."""
    wanted, expected = _hdfs_dirs(hdfs_cluster, 10)
    delay = 0.05
    proxy = HttpLatencyProxy(hdfs_cluster.port, delay)
    try:
        lister = _lister_through(hdfs_cluster, proxy)
        began = time.monotonic()
        assert lister.list_dirs(wanted) == expected  # 10 LISTSTATUS pipelined in one send
        assert lister.is_file(f"{wanted[0]}part-0.parquet") and not lister.is_file(wanted[1])
        elapsed = time.monotonic() - began
    finally:
        proxy.close()
    assert proxy.requests == 12 and proxy.connections == 1
    assert elapsed >= 12 * delay
    sent = [at for _, _, at in proxy.log]
    assert all(later - earlier >= delay * 0.99 for earlier, later in itertools.pairwise(sent))
    assert all(at - read >= delay * 0.99 for _, read, at in proxy.log)


def test_latency_proxy_link_mode_overlaps_pipelined_requests(hdfs_cluster):
    """The network model: each answer is still a round trip late, but requests in flight overlap."""
    wanted, expected = _hdfs_dirs(hdfs_cluster, 10)
    delay = 0.5
    proxy = HttpLatencyProxy(hdfs_cluster.port, delay, mode="link")
    try:
        assert _lister_through(hdfs_cluster, proxy).list_dirs(wanted) == expected
    finally:
        proxy.close()
    assert proxy.requests == 10
    assert all(at - read >= delay * 0.99 for _, read, at in proxy.log)
    assert max(read for _, read, _ in proxy.log) < min(at for _, _, at in proxy.log)  # all in flight at once
    with pytest.raises(ValueError, match="mode 'wire'"):
        HttpLatencyProxy(hdfs_cluster.port, delay, mode="wire")


def test_naive_planner_lists_through_dtggs_client(hdfs_cluster, tmp_path):
    """Same plan as DTGG, two requests per partition (marker status + listing) on DTGG's own
    WebHDFS client; through pyarrow/fsspec it sent six."""
    write_layout(tmp_path / "local", hours=3, rows=5, files=2)
    base = f"/dtgg-naive-{uuid.uuid4().hex[:8]}/data"
    hdfs_cluster.put(tmp_path / "local", base)
    proxy = HttpLatencyProxy(hdfs_cluster.port, 0.0)
    try:
        job = load(
            demo_doc(f"webhdfs://127.0.0.1:{proxy.port}{base}", hours=3, rows_per_shard=100), storage=tmp_path / "jobs"
        )
        counted = []
        for plan in (
            lambda: naive_plan(job, "history"),
            lambda: naive_plan(job, "history", marker_request=False),
            lambda: Planner(job, "history", threads=1, ledger=False).plan(),
        ):
            before = proxy.requests
            counted.append(([p.tasks for p in plan()], proxy.requests - before))
    finally:
        proxy.close()
    (naive, naive_requests), (lean, lean_requests), (dtgg, dtgg_requests) = counted
    assert naive == lean == dtgg and [len(t) for t in naive] == [4, 4, 4]
    assert (naive_requests, lean_requests, dtgg_requests) == (12, 6, 6)  # 6 partitions


def test_naive_and_dtgg_plan_the_same_on_s3_through_the_latency_proxy(s3_env, tmp_path, monkeypatch):
    """S3's HEAD (an answer without a body) and LIST requests pass the proxy; naive: 2 a partition."""
    import pyarrow.fs as pafs

    local = tmp_path / "local"
    write_layout(local, hours=2, rows=5, files=2)
    bucket = f"dtgg-{uuid.uuid4().hex[:8]}"
    fs = s3_env.filesystem()
    fs.create_dir(bucket)
    pafs.copy_files(str(local), f"{bucket}/data", source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
    proxy = HttpLatencyProxy(int(s3_env.endpoint.rsplit(":", 1)[1]), 0.01)
    try:
        secret = Path(os.environ["PRIMUS_SECRETS_DIR"]) / "primus_storage_default.json"  # the s3_env connection
        connection = json.loads(secret.read_text())
        secret.write_text(json.dumps({**connection, "extra": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}}))
        job = load(demo_doc(f"s3://{bucket}/data", hours=2, rows_per_shard=100), storage=tmp_path / "jobs")
        naive = [p.tasks for p in naive_plan(job, "history")]
        naive_requests = proxy.requests
        dtgg = [p.tasks for p in Planner(job, "history", threads=2, ledger=False).plan()]
    finally:
        proxy.close()
    assert naive == dtgg and [len(t) for t in naive] == [4, 4]
    assert naive_requests == 8  # HEAD marker + LIST, 4 partitions


def test_chunks_are_listed_ahead_with_at_most_threads_requests_at_once(layout, monkeypatch):
    """Two chunks' listings run while a third is generated, their requests on the lister's shared
    pool: never more than ``threads`` at once, and the plan is the one-thread plan."""
    job = _job(layout)
    one = [p.tasks for p in Planner(job, "history", threads=1, ledger=False, chunk_windows=1).plan()]
    busy = {"_ls": 0, "fused_listing": 0}
    most = dict(busy)
    lock = threading.Lock()

    def counted(name, call):
        def wrapper(*args, **kwargs):
            with lock:
                busy[name] += 1
                most[name] = max(most[name], busy[name])
            try:
                time.sleep(0.02)  # a remote store's latency: the calls in flight overlap
                return call(*args, **kwargs)
            finally:
                with lock:
                    busy[name] -= 1

        return wrapper

    monkeypatch.setattr(FusedLister, "_ls", counted("_ls", FusedLister._ls))
    monkeypatch.setattr(Planner, "fused_listing", counted("fused_listing", Planner.fused_listing))
    planner = Planner(job, "history", threads=2, ledger=False, chunk_windows=1)
    assert [p.tasks for p in planner.plan()] == one
    assert most == {"_ls": 2, "fused_listing": LISTED_AHEAD}
    assert planner.lister._pool is None  # the shared pool closed with the plan
