"""Reads from and writes to a real S3 store (SeaweedFS) cost few requests: each is a round trip to
a remote store, so the count is the latency a data task, a shard read or a commit pays. Counted by
the DTGG benchmark's HTTP proxy in front of the store."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from devstack.http_latency import HttpLatencyProxy
from primus_lib.data.shards import read_window, write_window
from primus_lib.data.sources.files import read_raw
from primus_lib.data.task import DataTask
from primus_lib.storage import locate
from tests.fixtures.s3 import S3Server

pytestmark = pytest.mark.integration

COLUMNS = ("request_id", "user_id", "item_id", "category", "price", "age", "ts")


@pytest.fixture
def counted(s3_server, monkeypatch, tmp_path) -> Iterator[tuple[HttpLatencyProxy, str]]:
    """A fresh bucket, and the store as this process's default connection through a counting proxy."""
    bucket = f"reads-{uuid.uuid4().hex[:8]}"
    s3_server.filesystem().create_dir(bucket)
    proxy = HttpLatencyProxy(int(s3_server.endpoint.rsplit(":", 1)[1]), delay=0.0)
    through = S3Server(f"127.0.0.1:{proxy.port}", s3_server.access_key, s3_server.secret_key)
    for key, value in through.env(tmp_path / "secrets").items():
        monkeypatch.setenv(key, value)
    try:
        yield proxy, bucket
    finally:
        proxy.close()


def _task(uri: str, fmt: str, size: int) -> DataTask:
    return DataTask("t", "history", "impressions", "w", uri, uri.split("://", 1)[1], fmt, size)


def _put(s3_server, key: str, data: bytes) -> None:
    with s3_server.filesystem().open_output_stream(key) as out:
        out.write(data)


def _table(rows: int) -> pa.Table:
    rng = np.random.default_rng(0)
    return pa.table(
        {
            "request_id": pa.array([f"r-{i}" for i in range(rows)]),
            "user_id": rng.integers(0, 10**7, rows),
            "item_id": rng.integers(0, 10**6, rows),
            "category": rng.integers(0, 500, rows),
            "price": rng.random(rows) * 100,
            "age": rng.random(rows) * 60,
            "ts": rng.integers(0, 3_600_000, rows),
        }
    )


def test_an_object_is_read_in_one_get(s3_server, counted):
    """A HEAD and one GET for a 6 MB object (its input stream had fetched it in 25 ranges)."""
    proxy, bucket = counted
    data = np.random.default_rng(1).bytes(6 << 20)
    _put(s3_server, f"{bucket}/blob", data)
    before = proxy.requests
    assert locate(f"s3://{bucket}/blob").read_bytes() == data
    assert proxy.requests - before <= 2
    assert bytes(locate(f"s3://{bucket}/blob").read_buffer()) == data
    with pytest.raises(FileNotFoundError):
        locate(f"s3://{bucket}/absent").read_bytes()
    _put(s3_server, f"{bucket}/dir/inside", b"x")
    with pytest.raises(FileNotFoundError):
        locate(f"s3://{bucket}/dir").read_bytes()


def test_a_parquet_data_task_fetches_its_columns_together(s3_server, counted, tmp_path):
    """Seven columns of one row group in 3 requests (the file's size, its footer, the columns; a
    request a column, pyarrow's ``pre_buffer=False``, takes 9); the rows are what the local file gives."""
    proxy, bucket = counted
    table = _table(125_000)  # 6 MB, bench/executor.py's files
    pq.write_table(table, tmp_path / "part.parquet")
    _put(s3_server, f"{bucket}/part.parquet", (tmp_path / "part.parquet").read_bytes())
    size = (tmp_path / "part.parquet").stat().st_size
    before = proxy.requests
    got = read_raw(_task(f"s3://{bucket}/part.parquet", "parquet", size), set(COLUMNS))
    assert proxy.requests - before <= 3, proxy.requests - before
    local = read_raw(_task(f"file://{tmp_path}/part.parquet", "parquet", size), set(COLUMNS))
    assert got.equals(local) and got.equals(table)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_csv_or_jsonl_data_task_is_fetched_in_one_get(s3_server, counted, tmp_path, fmt):
    proxy, bucket = counted
    table = _table(60_000)
    path = tmp_path / f"part.{fmt}"
    if fmt == "csv":
        import pyarrow.csv as pacsv

        pacsv.write_csv(table, path)
    else:
        table = table.select(["request_id", "ts"])
        rows = zip(*table.to_pydict().values(), strict=True)
        path.write_text("".join(f'{{"request_id": "{r}", "ts": {t}}}\n' for r, t in rows))
    assert path.stat().st_size > 1 << 20  # several of the parsers' 1 MB blocks
    _put(s3_server, f"{bucket}/part.{fmt}", path.read_bytes())
    size = path.stat().st_size
    before = proxy.requests
    got = read_raw(_task(f"s3://{bucket}/part.{fmt}", fmt, size))
    assert proxy.requests - before <= 2
    assert got.equals(read_raw(_task(f"file://{path}", fmt, size)))
    assert got.num_rows == table.num_rows


def test_a_window_goes_up_in_one_put_an_object(s3_server, counted, monkeypatch, tmp_path):
    """Each shard and the manifest in one PUT: a 3-shard window in 8 requests with the commit's own
    checks (a committed manifest looked for, the parts listed before the manifest goes up); a
    multipart upload of one part, three requests an object, took it 16."""
    proxy, bucket = counted
    table = _table(30_000)
    before = proxy.requests
    directory = locate(f"s3://{bucket}/w")
    manifest = write_window(directory, table, stream="history", window="w", seed=1, rows_per_shard=10_000)
    assert len(manifest.shards) == 3
    assert proxy.requests - before <= len(manifest.shards) + 1 + 4, proxy.requests - before
    # an object goes up at close now: a refused PUT (here: a wrong secret key) still fails the write
    wrong = S3Server(s3_server.endpoint, s3_server.access_key, "not-the-secret")
    for key, value in wrong.env(tmp_path / "wrong").items():
        monkeypatch.setenv(key, value)
    with pytest.raises(OSError, match="SIGNATURE_DOES_NOT_MATCH"):
        locate(f"s3://{bucket}/x").write_bytes(b"data")
    assert not s3_server.filesystem().get_file_info(f"{bucket}/x").is_file


def test_a_window_on_webhdfs_is_written_and_read_in_few_namenode_requests(hdfs_cluster):
    """Written: each object in one CREATE carrying its bytes (the NameNode makes the parents), where
    fsspec's writer took a MKDIRS, a CREATE of an empty file and an APPEND: a 3-shard window in 16
    NameNode requests with the commit's checks, 24 before. Read: a part, whose size and sha256 the
    manifest records, by one OPEN, where a file that may be replaced under its reader takes 5 requests
    (the client's status calls before, at and after the read): 8 with the manifest, 20 before."""
    proxy = HttpLatencyProxy(hdfs_cluster.port, delay=0.0)
    try:
        base = f"webhdfs://{hdfs_cluster.host}:{proxy.port}/requests-{uuid.uuid4().hex[:8]}"
        directory = locate(f"{base}/deep/w")
        table = _table(30_000)
        before = proxy.requests
        write_window(directory, table, stream="history", window="w", seed=1, rows_per_shard=10_000)
        assert proxy.requests - before <= 16, proxy.requests - before
        before = proxy.requests
        got = read_window(directory)
        assert proxy.requests - before <= 4 + 1 + 3, proxy.requests - before
        assert got.equals(table)
        with pytest.raises(FileNotFoundError):
            locate(f"{base}/deep/absent").read_buffer(checked=True)
        again = locate(f"{base}/a/b/c.bin")
        again.write_bytes(b"first")
        again.write_bytes(b"second, longer")  # overwritten whole
        assert again.read_bytes() == b"second, longer"
    finally:
        proxy.close()
