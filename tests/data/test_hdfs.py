"""Batch sources on a real HDFS (Hadoop's MiniDFSCluster: a NameNode and a DataNode) through the
project's WebHDFS path (primus_lib.filesystems: fsspec's WebHDFS client behind pyarrow):
fused listings, success markers, parquet reads (whole files and byte-range splits, which the
NameNode redirects to the DataNode), DTGG planning over HDFS partitions, and the NameNode
named by the environment instead of the URI."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from primus_lib.data.dtgg import PartitionNotReady, Planner, source_ready
from primus_lib.data.executor import run_window
from primus_lib.data.sources.files import read_raw
from primus_lib.filesystems import resolve
from tests.data.helpers import T0, clicks, impressions, write_layout
from tests.fixtures import connections
from tests.fixtures.specs import demo_doc, load


def _upload(hdfs_cluster, tmp_path: Path, **layout) -> tuple[Path, str, str]:
    """The demo layout on local disk and under a fresh HDFS directory: (local root, uri, hdfs path)."""
    local = tmp_path / "local"
    write_layout(local, **layout)
    base = f"/t-{uuid.uuid4().hex[:8]}/data"
    hdfs_cluster.put(local, base)
    return local, hdfs_cluster.uri(base), base


def test_a_window_on_hdfs_plans_with_one_listing_and_matches_the_local_bytes(hdfs_cluster, tmp_path):
    local, uri, base = _upload(hdfs_cluster, tmp_path, hours=3, rows=120, files=2)
    assert hdfs_cluster.ls(f"{base}/impressions/20261101/00") == ["_SUCCESS", "part-000.parquet", "part-001.parquet"]
    job = load(demo_doc(uri, hours=3, rows_per_shard=100), storage=tmp_path / "hdfsjob" / "jobs")
    planner = Planner(job, "history", threads=2, ledger=False)
    plans = list(planner.plan())
    assert [len(p.tasks) for p in plans] == [4, 4, 4]
    assert planner.listings == 6  # WebHDFS lists one directory a request: one per partition, markers included
    first = plans[0].tasks[0]
    assert first.uri == f"{uri}/impressions/20261101/00/part-000.parquet"
    assert first.size == (local / "impressions/20261101/00/part-000.parquet").stat().st_size
    on_hdfs = run_window(job, "history", T0).manifest
    on_disk = run_window(
        load(demo_doc(f"file://{local}", hours=3, rows_per_shard=100), storage=tmp_path / "localjob" / "jobs"),
        "history",
        T0,
    ).manifest
    assert on_hdfs.rows == 240
    assert [s.sha256 for s in on_hdfs.shards] == [s.sha256 for s in on_disk.shards]


def test_success_markers_and_bookkeeping_files_on_hdfs(hdfs_cluster, tmp_path):
    _, uri, base = _upload(hdfs_cluster, tmp_path, hours=3, rows=40, files=1)
    fs = hdfs_cluster.filesystem()
    late = f"{base}/clicks/20261101/02"
    fs.rm(f"{late}/_SUCCESS")
    # What HDFS writers leave around a partition: a job's _temporary dir, checksum files.
    hdfs_cluster.write_bytes(f"{base}/impressions/20261101/00/_temporary/0/part-9.parquet", b"partial")
    hdfs_cluster.write_bytes(f"{base}/impressions/20261101/00/.part-000.parquet.crc", b"crc")
    job = load(demo_doc(uri, hours=3, rows_per_shard=100), storage=tmp_path / "hdfsjob" / "jobs")

    ready, missing = source_ready(job, "history", "clicks", T0 + timedelta(hours=2))
    assert not ready and f"{uri}/clicks/20261101/02/" in missing and "'_SUCCESS' not found" in missing
    assert source_ready(job, "history", "impressions", T0 + timedelta(hours=2)) == (True, None)
    with pytest.raises(PartitionNotReady, match="clicks/20261101/02/ incomplete or late"):
        list(Planner(job, "history", ledger=False).plan())
    plans = list(Planner(job, "history", ledger=False).plan(T0, T0 + timedelta(hours=2)))
    assert [t.path.rsplit("/", 1)[1] for t in plans[0].by_source("impressions")] == ["part-000.parquet"]

    hdfs_cluster.write_bytes(f"{late}/_SUCCESS", b"")  # the late partition completes
    assert source_ready(job, "history", "clicks", T0 + timedelta(hours=2)) == (True, None)
    assert [len(p.tasks) for p in Planner(job, "history", ledger=False).plan()] == [2, 2, 2]


def test_parquet_byte_range_splits_read_every_row_group_once(hdfs_cluster, tmp_path):
    table = impressions(T0, 3000, seed=5)
    local = tmp_path / "big.parquet"
    pq.write_table(table, local, row_group_size=250)  # 12 row groups
    pq.write_table(clicks(table, seed=6), tmp_path / "clicks.parquet")
    base = f"/t-{uuid.uuid4().hex[:8]}/data"
    hdfs_cluster.put(local, f"{base}/impressions/20261101/00/part-000.parquet")
    hdfs_cluster.put(tmp_path / "clicks.parquet", f"{base}/clicks/20261101/00/part-000.parquet")
    for source in ("impressions", "clicks"):
        hdfs_cluster.write_bytes(f"{base}/{source}/20261101/00/_SUCCESS", b"")
    doc = demo_doc(hdfs_cluster.uri(base), hours=1, rows_per_shard=100)
    size = local.stat().st_size
    doc["spec"]["dataset"]["streams"][0]["sources"][0]["split_bytes"] = size // 5
    job = load(doc, storage=tmp_path / "splitjob" / "jobs")

    (plan,) = Planner(job, "history", ledger=False).plan()
    splits = plan.by_source("impressions")
    assert len(splits) == 6 and {t.splits for t in splits} == {6} and all(t.size == size for t in splits)
    parts = [read_raw(t) for t in splits]
    assert sum(p.num_rows for p in parts) == 3000
    ids = [i for p in parts for i in p.column("request_id").to_pylist()]
    assert sorted(ids) == sorted(table.column("request_id").to_pylist())
    assert sum(1 for p in parts if p.num_rows) > 1  # the ranges really divide the file
    assert run_window(job, "history", T0).manifest.rows == 3000


def test_the_namenode_and_user_come_from_the_default_connection_not_the_environment(
    hdfs_cluster, tmp_path, monkeypatch
):
    _, uri, base = _upload(hdfs_cluster, tmp_path, hours=1, rows=30, files=1)
    monkeypatch.setenv("PRIMUS_WEBHDFS_URL", "http://127.0.0.1:1")  # no longer read
    monkeypatch.setenv("HADOOP_USER_NAME", "env-user")
    connections.webhdfs_user(monkeypatch, tmp_path / "secrets", "etl", hdfs_cluster.webhdfs_url)
    job = load(
        demo_doc(f"webhdfs://{base}", hours=1, rows_per_shard=100), storage=tmp_path / "envjob" / "jobs"
    )  # webhdfs:///t-.../data
    (plan,) = Planner(job, "history", ledger=False).plan()
    assert plan.tasks[0].uri == f"{uri}/impressions/20261101/00/part-000.parquet"  # tasks name the NameNode
    location = resolve(f"webhdfs://{base}")
    # The NameNode answers for the user the client sent (GETHOMEDIRECTORY), a real round trip.
    assert location.fs.handler.fs.home_directory() == "/user/etl"
    connections.webhdfs_user(monkeypatch, tmp_path / "secrets", "other", hdfs_cluster.webhdfs_url)
    assert resolve(f"webhdfs://{base}").fs.handler.fs.home_directory() == "/user/other"
    assert run_window(job, "history", T0).manifest.rows == 30


def test_hdfs_scheme_needs_libhdfs_and_says_so(hdfs_cluster):
    """hdfs:// is pyarrow's libhdfs client (JNI); Hadoop's native libhdfs ships only in Hadoop's
    binary tarball. Where it is installed the same NameNode answers over RPC."""
    try:
        location = resolve(hdfs_cluster.namenode_rpc + "/")
    except OSError as exc:
        assert "libhdfs" in str(exc) and "webhdfs://" in str(exc)
    else:  # pragma: no cover - only with a Hadoop install
        assert location.fs.get_file_info("/").type.name == "Directory"


def test_unreachable_namenode_is_an_error_not_a_missing_partition(tmp_path):
    job = load(demo_doc("webhdfs://127.0.0.1:1/data", hours=1, rows_per_shard=100), storage=tmp_path / "jobs")
    with pytest.raises(OSError, match="127.0.0.1"):
        list(Planner(job, "history", threads=1, ledger=False).plan())
