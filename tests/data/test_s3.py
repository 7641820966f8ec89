"""Batch sources on a real S3 store (SeaweedFS): fused listing, readiness, and a full window."""

from __future__ import annotations

import json
import os
import uuid
from datetime import timedelta
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from primus_lib.data.dtgg import PartitionNotReady, Planner, source_ready
from primus_lib.data.executor import run_window
from tests.data.helpers import T0, write_layout
from tests.fixtures.specs import demo_doc, load

pytestmark = pytest.mark.integration


@pytest.fixture
def s3_layout(s3_env, tmp_path):
    local = tmp_path / "local"
    write_layout(local, hours=3, rows=120, files=2)
    bucket = f"primus-{uuid.uuid4().hex[:8]}"
    fs = s3_env.filesystem()
    fs.create_dir(bucket)
    pafs.copy_files(str(local), f"{bucket}/data", source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
    return local, f"s3://{bucket}/data", fs, bucket


def test_s3_window_plans_with_one_listing_and_matches_local_bytes(s3_layout, tmp_path):
    local, uri, fs, bucket = s3_layout
    job = load(demo_doc(uri, hours=3, rows_per_shard=100), storage=tmp_path / "s3job" / "jobs")
    planner = Planner(job, "history", threads=2, ledger=False)
    plans = list(planner.plan())
    assert [len(p.tasks) for p in plans] == [4, 4, 4]
    assert planner.listings == 5  # data/ and its 2 sources (pruning), then one walk per source's day
    assert plans[0].tasks[0].uri == f"{uri}/impressions/20261101/00/part-000.parquet"
    on_s3 = run_window(job, "history", T0).manifest
    on_disk = run_window(
        load(demo_doc(f"file://{local}", hours=3, rows_per_shard=100), storage=tmp_path / "localjob" / "jobs"),
        "history",
        T0,
    ).manifest
    assert on_s3.rows == 240 and [s.sha256 for s in on_s3.shards] == [s.sha256 for s in on_disk.shards]


def test_s3_missing_marker_and_bad_credentials(s3_layout, tmp_path, monkeypatch):
    _, uri, fs, bucket = s3_layout
    fs.delete_file(f"{bucket}/data/clicks/20261101/02/_SUCCESS")
    job = load(demo_doc(uri, hours=3, rows_per_shard=100), storage=tmp_path / "s3job" / "jobs")
    ready, missing = source_ready(job, "history", "clicks", T0 + timedelta(hours=2))
    assert not ready and f"{uri}/clicks/20261101/02/" in missing
    with pytest.raises(PartitionNotReady, match="clicks/20261101/02/ incomplete or late"):
        list(Planner(job, "history", ledger=False).plan())
    secret = Path(os.environ["PRIMUS_SECRETS_DIR"]) / "primus_storage_default.json"
    secret.write_text(json.dumps({**json.loads(secret.read_text()), "password": "wrong"}))  # the mounted secret
    with pytest.raises(OSError):
        list(Planner(job, "history", ledger=False).plan())


def test_credentials_given_to_the_factory_are_used_instead_of_the_default_connection(
    s3_env, s3_layout, tmp_path, monkeypatch
):
    """A caller that resolved the source's connection (the Airflow triggerer) passes credentials;
    neither the environment's AWS_* variables nor the default connection (here: wrong keys and a
    dead endpoint) is then read."""
    from primus_lib.filesystems import S3Credentials, WebHdfsCredentials, resolve

    _, uri, fs, bucket = s3_layout
    server = S3Credentials(s3_env.access_key, s3_env.secret_key, s3_env.url, "us-east-1")
    dead = {"conn_type": "aws", "login": "wrong", "password": "wrong", "extra": {"endpoint_url": "http://127.0.0.1:9"}}
    (Path(os.environ["PRIMUS_SECRETS_DIR"]) / "primus_storage_default.json").write_text(json.dumps(dead))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_env.access_key)  # never read by primus_lib
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_env.secret_key)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_env.url)
    selector = pafs.FileSelector(f"{bucket}/data/clicks/20261101/02")
    with pytest.raises(OSError):
        resolve(uri).fs.get_file_info(selector)  # the default connection's settings reach nothing
    names = {info.base_name for info in resolve(uri, server).fs.get_file_info(selector)}
    assert "_SUCCESS" in names
    doc = demo_doc(uri, hours=3, rows_per_shard=100)
    doc["spec"]["dataset"]["streams"][0]["sources"][1]["connection_id"] = "clicks_s3"
    job = load(doc, storage=tmp_path / "s3job" / "jobs")
    assert source_ready(job, "history", "clicks", T0 + timedelta(hours=2), {"clicks_s3": server}) == (True, None)
    assert s3_env.secret_key not in repr(server)  # kept out of reprs (and so of logs)
    with pytest.raises(ValueError, match="WebHdfsCredentials, expected S3Credentials"):
        resolve(uri, WebHdfsCredentials(user="etl"))
