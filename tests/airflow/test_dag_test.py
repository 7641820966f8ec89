"""Three consecutive windows of demo data end to end with ``dag.test()`` and the local backend."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.airflow import airflow_env, make_job, sync_dag_stubs

HERE = Path(__file__).resolve().parent
WINDOWS = ["2026-11-01T00:00:00+00:00", "2026-11-01T01:00:00+00:00", "2026-11-01T02:00:00+00:00"]
IDS = ["20261101T000000Z", "20261101T010000Z", "20261101T020000Z"]


def _run(env: dict, job, out: Path, runs: list[str]) -> dict:
    done = subprocess.run(
        [sys.executable, str(HERE / "_dag_test_runner.py"), str(job.dags), job.name, str(out), *runs],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_three_windows_end_to_end_then_a_rerun_is_idempotent(tmp_path: Path, monkeypatch):
    from primus_lib.data.training_queue import TrainingQueue
    from primus_lib.paths import JobPaths
    from primus_lib.resources import backend_for
    from primus_lib.spec import load_job

    # The timer runs on past the three windows: the service-mode window 02:00 is not the last one,
    # and its run is never followed by 03:00's. The trainer must still finish it on its own (train
    # the window's last partial minibatch once no next window is available) for its `train` task,
    # which waits until progress.json lists the window, to succeed.
    job = make_job(tmp_path / "job", end="2026-11-01T05:00:00Z")
    home = tmp_path / "airflow"
    home.mkdir()
    env = airflow_env(home, job)
    subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "db", "migrate"],
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    sync_dag_stubs(env, job.dags)
    # windows 1-2: the trainer runs synchronously per window (inline); window 3: the real path,
    # a long-running trainer started by the local backend and a deferral on its progress file.
    runs = [f"{WINDOWS[0]}@inline", f"{WINDOWS[1]}@inline", f"{WINDOWS[2]}@service"]
    for key, value in job.env.items():
        monkeypatch.setenv(key, value)
    try:
        report = _run(env, job, tmp_path / "report.json", runs)
    finally:
        backend_for(load_job(job.spec), str(job.spec)).stop()
    for run in report["runs"]:
        assert run["state"] == "success", run
        assert run["tasks"]["history.sink[-1]"] == "success" and run["tasks"]["train[-1]"] == "success"
        assert any(k.startswith("history.execute_impressions[") for k in run["tasks"])
        assert run["metrics"]["samples"] > 0 and run["metrics"]["auc"] is not None
    assert [r["metrics"]["window"] for r in report["runs"]] == IDS
    model_events = [e["extra"] for e in report["asset_events"] if e["uri"] == "primus://af-demo/model"]
    assert [e["window"] for e in model_events] == IDS and all("auc" in e for e in model_events)
    data_events = [e["extra"]["window"] for e in report["asset_events"] if e["uri"] == "primus://af-demo/history"]
    assert data_events == IDS

    spec = load_job(job.spec)
    paths = JobPaths.for_job(spec)
    queued = TrainingQueue(paths.ledger).windows("history")
    assert [w.window for w in queued] == IDS  # committed in time order
    progress = json.loads(paths.progress.read_text())
    assert all(f"history/{w}" in progress["consumed"] for w in IDS)
    manifest = (paths.window_dir("history", spec.spec.timer.start) / "manifest.json").read_bytes()

    # Re-running a finished window (data + sink, trainer skipped) changes nothing.
    again = _run(env, job, tmp_path / "again.json", [f"{WINDOWS[0]}@skip"])
    assert again["runs"][0]["state"] == "success", again["runs"][0]
    assert [w.window for w in TrainingQueue(paths.ledger).windows("history")] == IDS
    assert (paths.window_dir("history", spec.spec.timer.start) / "manifest.json").read_bytes() == manifest
