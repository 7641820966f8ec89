"""The operators on an S3 source (SeaweedFS) whose credentials come only from an Airflow connection."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.fixtures.airflow import make_job
from tests.fixtures.specs import airflow_doc, batch_stream, write_spec

BUCKET = "primus-logs"


@pytest.mark.integration
def test_source_data_tasks_and_join_read_s3_through_the_spec_connection(s3_server, tmp_path: Path, monkeypatch):
    from primus_operators.operators import PrimusDataSourceOperator, PrimusDataTaskOperator, PrimusJoinerOperator

    local = make_job(tmp_path / "local", end="2026-11-01T01:00:00Z", rows_per_hour=80)
    fs = s3_server.filesystem()
    fs.create_dir(BUCKET)
    for path in sorted(local.data.rglob("*")):
        if path.is_file() and path.parent.name == "00":
            fs.open_output_stream(f"{BUCKET}/{path.relative_to(local.data)}").write(path.read_bytes())
    stream = batch_stream(f"s3://{BUCKET}", connection_id="logs_s3")
    spec_path = write_spec(tmp_path / "s3-job.yaml", airflow_doc("s3-job", hours=1, streams=[stream]))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path / "home"))
    conn = {
        "conn_type": "aws",
        "login": s3_server.access_key,
        "password": s3_server.secret_key,
        "extra": {"endpoint_url": s3_server.url, "region_name": "us-east-1"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_LOGS_S3", json.dumps(conn))
    context = {"data_interval_start": datetime(2026, 11, 1, tzinfo=UTC), "params": {}}

    outputs = []
    for source in ("impressions", "clicks"):
        op = PrimusDataSourceOperator(
            task_id=f"source_{source}", spec_path=str(spec_path), stream="history", source=source
        )
        units = op.execute(context)
        tasks = [t for unit in units for t in unit]
        assert tasks and all(t["uri"].startswith(f"s3://{BUCKET}/{source}/20261101/00/") for t in tasks)
        for unit in units:
            op = PrimusDataTaskOperator(task_id=f"execute_{source}", spec_path=str(spec_path), data_tasks=unit)
            outputs.extend(op.execute(context))
    manifest = PrimusJoinerOperator(task_id="join", spec_path=str(spec_path), stream="history").execute(context)
    assert manifest["rows"] > 0 and manifest["window"] == "20261101T000000Z"
    assert len(outputs) >= 2
    assert "AWS_ACCESS_KEY_ID" not in os.environ  # never written: the connection reached the factories typed


@pytest.mark.integration
def test_job_state_on_s3_through_the_storage_connection_keeps_the_secret_out_of_logs_and_xcoms(
    s3_server, tmp_path: Path, monkeypatch, caplog, capsys
):
    """spec.storage.root on S3 with spec.storage.connection_id: the committed window lands in the
    bucket with credentials only from the Airflow connection (AIRFLOW_CONN_*), and the secret key
    shows in no task log line, XCom value, spec or state object."""
    import collections
    import logging
    import types

    from primus_operators.operators import (
        PrimusDataSourceOperator,
        PrimusDataTaskOperator,
        PrimusJoinerOperator,
        PrimusSinkOperator,
    )

    local = make_job(tmp_path / "local", end="2026-11-01T01:00:00Z", rows_per_hour=80)
    fs = s3_server.filesystem()
    fs.create_dir("primus-state")
    storage = {"root": "s3://primus-state/jobs", "connection_id": "state_s3"}
    spec_path = write_spec(tmp_path / "s3-state.yaml", airflow_doc("s3-state", hours=1, storage=storage))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PRIMUS_DATA", str(local.data))
    conn = {
        "conn_type": "aws",
        "login": s3_server.access_key,
        "password": s3_server.secret_key,
        "extra": {"endpoint_url": s3_server.url, "region_name": "us-east-1"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_STATE_S3", json.dumps(conn))
    caplog.set_level(logging.DEBUG)
    context = {"data_interval_start": datetime(2026, 11, 1, tzinfo=UTC), "params": {}}

    xcoms: list = []
    for source in ("impressions", "clicks"):
        units = PrimusDataSourceOperator(
            task_id=f"source_{source}", spec_path=str(spec_path), stream="history", source=source
        ).execute(context)
        xcoms.append(units)
        for unit in units:
            op = PrimusDataTaskOperator(task_id=f"execute_{source}", spec_path=str(spec_path), data_tasks=unit)
            xcoms.append(op.execute(context))
    manifest = PrimusJoinerOperator(task_id="join", spec_path=str(spec_path), stream="history").execute(context)
    xcoms.append(manifest)
    sink = PrimusSinkOperator(task_id="sink", spec_path=str(spec_path), job_name="s3-state", stream="history")
    outlets = collections.defaultdict(types.SimpleNamespace)  # what the task runner hands the asset's events
    xcoms.append(sink.execute({**context, "outlet_events": outlets}))
    assert [e.extra["rows"] for e in outlets.values()] == [manifest["rows"]]
    assert manifest["rows"] > 0 and manifest["window"] == "20261101T000000Z"

    import pyarrow.fs as pafs

    committed = fs.get_file_info(pafs.FileSelector("primus-state/jobs/s3-state", recursive=True))
    names = [info.path for info in committed if info.type == pafs.FileType.File]
    assert "primus-state/jobs/s3-state/windows/history/20261101T000000Z/manifest.json" in names
    assert any("/part-" in name for name in names)

    secret = s3_server.secret_key
    assert "AWS_SECRET_ACCESS_KEY" not in os.environ  # never written to the environment
    assert secret not in json.dumps(xcoms, default=str)
    captured = capsys.readouterr()
    assert caplog.records and secret not in caplog.text and secret not in captured.out + captured.err
    assert secret not in spec_path.read_text()
    for name in names:
        with fs.open_input_stream(name) as stream:
            assert secret.encode() not in stream.read(), name
