"""An Airflow ``webhdfs`` connection on a real HDFS (MiniDFSCluster): the project's storage hook
turns it into the data plane's env (NameNode + user), the operators read the spec's
``webhdfs:///`` partitions through it, and the Apache HDFS provider's own WebHDFSHook uses the
same connection (it uploads the partitions here, and picks the live NameNode of an HA list)."""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from primus_operators.hooks import PrimusStorageHook, airflow_resolver

from primus_lib.credentials import WebHdfsCredentials
from tests.fixtures.airflow import make_job
from tests.fixtures.specs import airflow_doc, batch_stream, write_spec


def _conn(monkeypatch, conn_id: str, hdfs_cluster, **fields) -> dict:
    body = {"conn_type": "webhdfs", "host": hdfs_cluster.host, "port": hdfs_cluster.port, "login": "etl", **fields}
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(body))
    return body


def _spec(tmp_path: Path, base: str, conn_id: str) -> Path:
    stream = batch_stream(f"webhdfs://{base}", connection_id=conn_id)
    return write_spec(tmp_path / "hdfs-job.yaml", airflow_doc("hdfs-job", hours=1, streams=[stream]))


def test_the_operators_read_hdfs_through_the_spec_connection(hdfs_cluster, tmp_path: Path, monkeypatch):
    from airflow.providers.apache.hdfs.hooks.webhdfs import WebHDFSHook
    from primus_operators.operators import PrimusDataSourceOperator, PrimusDataTaskOperator, PrimusJoinerOperator

    from primus_lib.spec import load_job

    for name in ("HADOOP_USER_NAME", "PRIMUS_WEBHDFS_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path / "home"))
    _conn(monkeypatch, "hdfs_logs", hdfs_cluster)
    local = make_job(tmp_path / "local", end="2026-11-01T01:00:00Z", rows_per_hour=80)
    base = f"/logs-{uuid.uuid4().hex[:8]}"
    provider = WebHDFSHook("hdfs_logs")  # the provider's hook, same connection: upload the first hour
    for source in ("impressions", "clicks"):
        provider.load_file(str(local.data / source / "20261101" / "00"), f"{base}/{source}/20261101/00")
        assert provider.check_for_path(f"{base}/{source}/20261101/00/_SUCCESS")
    status = hdfs_cluster.rest(f"{base}/impressions/20261101/00/_SUCCESS", "GETFILESTATUS")["FileStatus"]
    assert status["owner"] == "etl"  # written as the connection's user

    spec_path = _spec(tmp_path, base, "hdfs_logs")
    assert PrimusStorageHook("hdfs_logs").credentials() == WebHdfsCredentials("etl", hdfs_cluster.webhdfs_url)
    context = {"data_interval_start": datetime(2026, 11, 1, tzinfo=UTC), "params": {}}
    outputs = []
    for source in ("impressions", "clicks"):
        op = PrimusDataSourceOperator(
            task_id=f"source_{source}", spec_path=str(spec_path), stream="history", source=source
        )
        units = op.execute(context)
        tasks = [t for unit in units for t in unit]
        assert tasks and all(t["uri"].startswith(hdfs_cluster.uri(f"{base}/{source}/20261101/00/")) for t in tasks)
        for unit in units:
            task_op = PrimusDataTaskOperator(task_id=f"execute_{source}", spec_path=str(spec_path), data_tasks=unit)
            outputs.extend(task_op.execute(context))
    manifest = PrimusJoinerOperator(task_id="join", spec_path=str(spec_path), stream="history").execute(context)
    expected = sum(pq.read_metadata(f).num_rows for f in (local.data / "impressions/20261101/00").glob("*.parquet"))
    assert manifest["rows"] == expected > 0 and manifest["window"] == "20261101T000000Z"
    assert len(outputs) >= 2
    assert "PRIMUS_WEBHDFS_URL" not in os.environ  # never written: the connection reached the factories typed

    from primus_lib.credentials import current, using
    from primus_lib.filesystems import resolve

    job = load_job(spec_path)
    with using(airflow_resolver()):  # the NameNode saw the connection's user
        credentials = current().storage(job.stream("history").sources[0].connection_id)
        assert resolve(f"webhdfs://{base}", credentials).fs.handler.fs.home_directory() == "/user/etl"


def test_an_ha_namenode_list_narrows_to_the_namenode_that_answers(hdfs_cluster, monkeypatch):
    # 127.0.0.2 is loopback too but nothing listens there on this port: a NameNode that is down.
    _conn(monkeypatch, "hdfs_ha", hdfs_cluster, host=f"127.0.0.2,{hdfs_cluster.host}")
    assert PrimusStorageHook("hdfs_ha").credentials().namenode_url == hdfs_cluster.webhdfs_url
    _conn(monkeypatch, "hdfs_down", hdfs_cluster, host="127.0.0.2,127.0.0.3")
    with pytest.raises(Exception, match="valid server"):
        PrimusStorageHook("hdfs_down").credentials()


def test_webhdfs_connection_fields_map_to_typed_credentials(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_HDFS_TLS",
        json.dumps({"conn_type": "webhdfs", "host": "nn.example", "login": "svc", "extra": {"use_ssl": "True"}}),
    )
    assert PrimusStorageHook("hdfs_tls").credentials() == WebHdfsCredentials("svc", "https://nn.example:9870")
    # A plain ``hdfs`` connection names an RPC NameNode (libhdfs reads it from HADOOP_CONF_DIR).
    monkeypatch.setenv("AIRFLOW_CONN_HDFS_RPC", json.dumps({"conn_type": "hdfs", "host": "nn", "port": 8020}))
    assert PrimusStorageHook("hdfs_rpc").credentials() == WebHdfsCredentials(None, None)
