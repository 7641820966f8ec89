"""``primus backfill`` against a real scheduler + API server + triggerer (one shared ``airflow standalone``
on PostgreSQL). The module's backfill of every window runs once (``backfilled``) and records what
it produced, so each test stands on its own in any order or alone."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

WINDOWS = ["20261101T000000Z", "20261101T010000Z", "20261101T020000Z"]

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _backfill(server, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "primus_lib.cli.main", "backfill", str(server.job.spec), "--api", server.url,
               "--password", server.password, "--wait", "--timeout", "420", *extra]  # fmt: skip
    return subprocess.run(command, env=server.env, capture_output=True, text=True, timeout=480)


@dataclass(frozen=True)
class Backfilled:
    """What the backfill of every window left, read right after it (later tests change the runs)."""

    server: object
    spec: object
    runs: list[dict]  # the backfill's DAG runs, oldest first
    task_instances: list[dict[str, dict]]  # per run: task id -> task instance
    train_xcoms: list[object]  # per run: the train task's return value
    queued: list[tuple[int, str, int]]  # the training queue: (seq, window, rows)


@pytest.fixture(scope="module")
def backfilled(airflow_server) -> Backfilled:
    """Backfill every window of the job once, through the real deferred trainer."""
    from primus_lib.data.training_queue import TrainingQueue
    from primus_lib.paths import JobPaths
    from primus_lib.resources import backend_for
    from primus_lib.spec import load_job

    server, api = airflow_server, airflow_server.api()
    with pytest.MonkeyPatch.context() as mp:
        for key, value in server.job.env.items():
            mp.setenv(key, value)  # PRIMUS_HOME: where the job's state is
        spec = load_job(server.job.spec)
        try:
            done = _backfill(server, "--from", "2026-11-01T00:00Z", "--to", "2026-11-01T03:00Z")
            assert done.returncode == 0, done.stdout + done.stderr
        finally:
            backend_for(spec, str(server.job.spec)).stop()
        runs = sorted((r for r in api.dag_runs(spec.name) if r["run_type"] == "backfill"),
                      key=lambda r: r["logical_date"])  # fmt: skip
        base = f"/api/v2/dags/{spec.name}/dagRuns"
        tis = [{ti["task_id"]: ti for ti in api.request("GET", f"{base}/{r['dag_run_id']}/taskInstances")[
            "task_instances"]} for r in runs]  # fmt: skip
        xcoms = [api.request("GET", f"{base}/{r['dag_run_id']}/taskInstances/train/xcomEntries/return_value")["value"]
                 for r in runs]  # fmt: skip
        queued = [(w.seq, w.window, w.rows) for w in TrainingQueue(JobPaths.for_job(spec).ledger).windows("history")]
    return Backfilled(server, spec, runs, tis, xcoms, queued)


def test_backfill_runs_every_window_in_order_through_the_deferred_trainer(backfilled):
    spec, api = backfilled.spec, backfilled.server.api()
    assert [r["state"] for r in backfilled.runs] == ["success"] * 3
    sinks = []
    for by_id, xcom in zip(backfilled.task_instances, backfilled.train_xcoms, strict=True):
        assert by_id["train"]["state"] == "success"
        assert "auc=" in (by_id["train"]["note"] or "")  # the metrics on the task note (Grid view)
        sinks.append(by_id["history.sink"]["end_date"])
        assert "auc" in str(xcom)
    assert sinks == sorted(sinks)  # the sink committed the windows in time order
    assert [window for _, window, _ in backfilled.queued] == WINDOWS
    assert all(rows > 0 for _, _, rows in backfilled.queued)
    pool = api.request("GET", f"/api/v2/pools/primus-{spec.name}")
    assert pool["slots"] == 2  # created by the plugin's listener from resources.roles.data_executor


def test_the_runs_are_in_the_postgresql_metadata_database(backfilled):
    """Airflow kept its state in PostgreSQL, not in a SQLite file of its AIRFLOW_HOME."""
    import sqlalchemy as sa

    url = backfilled.server.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert url.startswith("postgresql+psycopg2://")
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT version()")).scalar().startswith("PostgreSQL ")
            dates = conn.execute(sa.text("SELECT logical_date FROM dag_run WHERE dag_id = :d AND run_type = 'backfill' "
                                         "ORDER BY logical_date"), {"d": backfilled.spec.name}).scalars().all()  # fmt: skip
    finally:
        engine.dispose()
    assert [d.strftime("%Y%m%dT%H%M%SZ") for d in dates] == WINDOWS
    assert not (backfilled.server.home / "airflow.db").exists()


def test_rerunning_a_finished_window_through_backfill_is_idempotent(backfilled, monkeypatch):
    from primus_lib.data.training_queue import TrainingQueue
    from primus_lib.paths import JobPaths

    server, spec = backfilled.server, backfilled.spec
    for key, value in server.job.env.items():
        monkeypatch.setenv(key, value)
    paths = JobPaths.for_job(spec)
    before = [(w.seq, w.window, w.rows) for w in TrainingQueue(paths.ledger).windows("history")]
    assert [window for _, window, _ in before] == WINDOWS  # what the backfill committed
    manifest = Path(paths.window_dir("history", spec.spec.timer.start), "manifest.json").read_bytes()
    done = _backfill(
        server, "--from", "2026-11-01T00:00Z", "--to", "2026-11-01T01:00Z", "--reprocess", "completed", "--mode", "skip"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "success" in done.stdout
    assert [(w.seq, w.window, w.rows) for w in TrainingQueue(paths.ledger).windows("history")] == before
    assert Path(paths.window_dir("history", spec.spec.timer.start), "manifest.json").read_bytes() == manifest
