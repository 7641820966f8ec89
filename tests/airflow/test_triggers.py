from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import uuid
from pathlib import Path

import pytest
from primus_operators.triggers import SourceReadyTrigger, TrainerProgressTrigger

from tests.fixtures.airflow import make_job


def events(trigger) -> list[dict]:
    async def collect():
        return [event.payload async for event in trigger.run()]

    return asyncio.run(collect())


def test_trainer_trigger_serializes_and_fires_once_when_the_window_is_consumed(tmp_path: Path):
    progress = tmp_path / "progress.json"
    trigger = TrainerProgressTrigger(
        str(progress), ["history/20261101T000000Z"], poll_interval=0.05, timeout=20, first_check_after=0
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "primus_operators.triggers.trainer_progress.TrainerProgressTrigger"
    rebuilt = TrainerProgressTrigger(**kwargs)

    def write_later():
        time.sleep(0.3)
        doc = {
            "consumed": {"history/20261101T000000Z": {"samples": 250, "auc": 0.61, "logloss": 0.4, "at": 1}},
            "step": 2,
        }
        tmp = progress.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(progress)

    thread = threading.Thread(target=write_later)
    thread.start()
    got = events(rebuilt)
    thread.join()
    assert len(got) == 1 and got[0]["status"] == "success"
    assert got[0]["windows"]["history/20261101T000000Z"]["auc"] == 0.61


def test_trainer_trigger_times_out_naming_the_missing_window(tmp_path: Path):
    progress = tmp_path / "progress.json"
    progress.write_text(json.dumps({"consumed": {"history/20261101T000000Z": {"samples": 1}}, "step": 7}))
    got = events(
        TrainerProgressTrigger(str(progress), ["history/20261101T000000Z", "history/20261101T010000Z"], 0.05, 0.3)
    )
    assert len(got) == 1 and got[0]["status"] == "timeout"
    assert "history/20261101T010000Z" in got[0]["message"] and "step 7" in got[0]["message"]


def test_trainer_trigger_ends_with_the_jobs_error_when_the_trainer_failed(tmp_path: Path, failing_trainer_job):
    """A failed job never consumes the window: the deferred task must end with the job's error
    (found when a scheduler-run DAG's train tasks stayed deferred after the trainer gave up)."""
    from primus_lib.resources import job_failure

    spec, backend = failing_trainer_job
    assert job_failure(spec) is None  # nothing started yet: not failed
    backend.submit()
    trigger = TrainerProgressTrigger(
        str(tmp_path / "progress.json"),
        ["history/20261101T000000Z"],
        poll_interval=0.1,
        timeout=60,
        first_check_after=0,
        spec_path=spec,
    )
    started = time.monotonic()
    got = events(TrainerProgressTrigger(**trigger.serialize()[1]))
    assert len(got) == 1 and got[0]["status"] == "error", got
    assert "critical role 'trainer'" in got[0]["message"] and "exit 3" in got[0]["message"]
    assert time.monotonic() - started < 60  # ended by the failure, not by the timeout


def test_source_trigger_waits_for_the_success_marker_then_fires(tmp_path: Path, monkeypatch):
    job = make_job(tmp_path, end="2026-11-01T02:00:00Z", rows_per_hour=50)
    for key, value in job.env.items():
        monkeypatch.setenv(key, value)
    marker = job.data / "clicks" / "20261101" / "01" / "_SUCCESS"
    marker.unlink()
    trigger = SourceReadyTrigger(
        str(job.spec),
        "history",
        "clicks",
        "2026-11-01T01:00:00+00:00",
        poll_interval=0.05,
        timeout=20,
        first_check_after=0.05,
    )
    assert SourceReadyTrigger(**trigger.serialize()[1]).serialize() == trigger.serialize()
    threading.Timer(0.4, marker.write_text, args=("",)).start()
    got = events(trigger)
    assert [e["status"] for e in got] == ["success"]


def test_source_trigger_timeout_names_the_missing_path(tmp_path: Path, monkeypatch):
    job = make_job(tmp_path, end="2026-11-01T01:00:00Z", rows_per_hour=50)
    for key, value in job.env.items():
        monkeypatch.setenv(key, value)
    got = events(SourceReadyTrigger(str(job.spec), "history", "impressions", "2026-11-01T05:00:00+00:00", 0.05, 0.2))
    assert len(got) == 1 and got[0]["status"] == "timeout"
    assert "impressions/20261101/05" in got[0]["message"]


def test_source_trigger_reports_a_broken_spec_as_an_error_event(tmp_path: Path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("apiVersion: primus.dev/v1alpha1\nkind: PrimusJob\n")
    got = events(SourceReadyTrigger(str(spec), "history", "clicks", "2026-11-01T00:00:00+00:00", 0.05, 1))
    assert got[0]["status"] == "error" and "bad.yaml" in got[0]["message"]


@pytest.mark.integration
def test_source_trigger_reads_s3_with_the_sources_connection_and_sets_no_environment(
    s3_server, tmp_path: Path, monkeypatch
):
    """The triggerer's environment has no storage settings: the trigger resolves the source's
    ``connection_id`` itself (``aget_connection``) and hands the credentials to the filesystem."""
    from primus_operators.operators import source as source_module

    from tests.fixtures.specs import airflow_doc, batch_stream, write_spec

    bucket = f"trigger-{uuid.uuid4().hex[:8]}"
    fs = s3_server.filesystem()
    fs.create_dir(bucket)
    part = f"{bucket}/clicks/20261101/00"
    fs.open_output_stream(f"{part}/part-0.parquet").write(b"not read by the readiness check")
    stream = batch_stream(f"s3://{bucket}", connection_id="trigger_s3")
    write_spec(tmp_path / "s3-trigger.yaml", airflow_doc("s3-trigger", hours=1, streams=[stream]))
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path / "home"))
    extra = {"endpoint_url": s3_server.url, "region_name": "us-east-1"}
    conn = {"conn_type": "aws", "login": s3_server.access_key, "password": s3_server.secret_key, "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_TRIGGER_S3", json.dumps(conn))
    window = "2026-11-01T00:00:00+00:00"
    trigger = SourceReadyTrigger(str(tmp_path / "s3-trigger.yaml"), "history", "clicks", window, 0.1, 60, 0)
    seen: list[str] = []

    def watch_then_mark() -> None:  # the marker lands after the trigger looked at least twice
        deadline = time.monotonic() + 30
        while len(seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        fs.open_output_stream(f"{part}/_SUCCESS").close()

    real_readiness = source_module.readiness

    def counted(*args, **kwargs) -> tuple[bool, str]:
        result = real_readiness(*args, **kwargs)
        seen.append(result[1])
        assert not [k for k in os.environ if k.startswith("AWS_")]  # never through the environment
        return result

    monkeypatch.setattr(source_module, "readiness", counted)
    marker = threading.Thread(target=watch_then_mark)
    marker.start()
    got = events(trigger)
    marker.join()
    assert [e["status"] for e in got] == ["success"], got
    assert len(seen) >= 3 and f"s3://{part}/" in seen[0]  # not ready, read from the bucket; then ready
