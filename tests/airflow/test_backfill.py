"""``primus backfill`` against a real scheduler + API server + triggerer (one shared ``airflow standalone``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

WINDOWS = ["20261101T000000Z", "20261101T010000Z", "20261101T020000Z"]


def _backfill(server, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "primus_lib.cli.main", "backfill", str(server.job.spec), "--api", server.url,
               "--password", server.password, "--wait", "--timeout", "420", *extra]  # fmt: skip
    return subprocess.run(command, env=server.env, capture_output=True, text=True, timeout=480)


@pytest.mark.integration
@pytest.mark.slow
def test_backfill_runs_every_window_in_order_through_the_deferred_trainer(airflow_server, monkeypatch):
    from primus_lib.data.training_queue import TrainingQueue
    from primus_lib.paths import JobPaths
    from primus_lib.resources import backend_for
    from primus_lib.spec import load_job

    server, api = airflow_server, airflow_server.api()
    for key, value in server.job.env.items():
        monkeypatch.setenv(key, value)  # PRIMUS_HOME: where the job's state is
    spec = load_job(server.job.spec)
    try:
        done = _backfill(server, "--from", "2026-11-01T00:00Z", "--to", "2026-11-01T03:00Z")
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        backend_for(spec, str(server.job.spec)).stop()
    runs = sorted((r for r in api.dag_runs(spec.name) if r["run_type"] == "backfill"), key=lambda r: r["logical_date"])
    assert [r["state"] for r in runs] == ["success"] * 3
    sinks = []
    for run in runs:
        tis = api.request("GET", f"/api/v2/dags/{spec.name}/dagRuns/{run['dag_run_id']}/taskInstances")[
            "task_instances"
        ]
        by_id = {ti["task_id"]: ti for ti in tis}
        assert by_id["train"]["state"] == "success"
        assert "auc=" in (by_id["train"]["note"] or "")  # the metrics on the task note (Grid view)
        sinks.append(by_id["history.sink"]["end_date"])
        train = api.request(
            "GET", f"/api/v2/dags/{spec.name}/dagRuns/{run['dag_run_id']}/taskInstances/train/xcomEntries/return_value"
        )
        assert "auc" in str(train["value"])
    assert sinks == sorted(sinks)  # the sink committed the windows in time order
    paths = JobPaths.for_job(spec)
    assert [w.window for w in TrainingQueue(paths.ledger).windows("history")] == WINDOWS
    pool = api.request("GET", f"/api/v2/pools/primus-{spec.name}")
    assert pool["slots"] == 2  # created by the plugin's listener from resources.roles.data_executor


@pytest.mark.integration
@pytest.mark.slow
def test_rerunning_a_finished_window_through_backfill_is_idempotent(airflow_server, monkeypatch):
    from primus_lib.data.training_queue import TrainingQueue
    from primus_lib.paths import JobPaths
    from primus_lib.spec import load_job

    server = airflow_server
    for key, value in server.job.env.items():
        monkeypatch.setenv(key, value)
    spec = load_job(server.job.spec)
    paths = JobPaths.for_job(spec)
    before = [(w.seq, w.window, w.rows) for w in TrainingQueue(paths.ledger).windows("history")]
    if not before:
        pytest.skip("needs the windows of the backfill test")
    manifest = Path(paths.window_dir("history", spec.spec.timer.start), "manifest.json").read_bytes()
    done = _backfill(
        server, "--from", "2026-11-01T00:00Z", "--to", "2026-11-01T01:00Z", "--reprocess", "completed", "--mode", "skip"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "success" in done.stdout
    assert [(w.seq, w.window, w.rows) for w in TrainingQueue(paths.ledger).windows("history")] == before
    assert Path(paths.window_dir("history", spec.spec.timer.start), "manifest.json").read_bytes() == manifest
