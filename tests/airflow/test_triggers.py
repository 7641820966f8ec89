from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

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


def test_trainer_trigger_ends_with_the_jobs_error_when_the_trainer_failed(tmp_path: Path, monkeypatch):
    """A failed job never consumes the window: the deferred task must end with the job's error
    (found when a scheduler-run DAG's train tasks stayed deferred after the trainer gave up)."""
    import yaml

    from primus_lib.resources import backend_for, job_failure
    from tests.resources.conftest import make_job as make_resource_job
    from tests.resources.conftest import py

    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PRIMUS_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("PRIMUS_SUPERVISOR_POLL", "0.1")
    job = make_resource_job(
        {"data_executor": {"replicas": 1}, "trainer": {"command": py("raise SystemExit(3)"), "max_restarts": 0}}
    )
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(job.model_dump(mode="json", exclude_none=True)))
    backend = backend_for(job, str(spec))
    assert job_failure(str(spec)) is None  # nothing started yet: not failed
    backend.submit()
    try:
        trigger = TrainerProgressTrigger(
            str(tmp_path / "progress.json"), ["history/20261101T000000Z"], poll_interval=0.1, timeout=60,
            first_check_after=0, spec_path=str(spec),
        )  # fmt: skip
        started = time.monotonic()
        got = events(TrainerProgressTrigger(**trigger.serialize()[1]))
    finally:
        backend.stop()
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
