"""Backfill from the Airflow UI against a real scheduler + API server + triggerer (one shared ``airflow
standalone`` on PostgreSQL), through the REST calls the UI's backfill dialog makes (Airflow 3.3.2's
``ui/dist``: a ``POST /api/v2/backfills/dry_run`` preview as the form changes, then on "Run"
``PATCH /api/v2/dags/{id}`` when "unpause" is ticked and ``POST /api/v2/backfills``), with the
dialog's defaults where the user keeps them (one run at a time, the DAG's own params). The
module's backfill of every window runs once (``backfilled``) and records what it produced, so each
test stands on its own in any order or alone. ``primus backfill`` (the CLI path) re-runs a window.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

WINDOWS = ["20261101T000000Z", "20261101T010000Z", "20261101T020000Z"]
# The dialog's date pickers send JavaScript's toISOString(); its "to" is a window start (inclusive).
FROM_DATE, TO_DATE = "2026-11-01T00:00:00.000Z", "2026-11-01T02:00:00.000Z"

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def dialog_body(dag_id: str, reprocess: str) -> dict:
    """The dialog's form: the user picks the range and "reprocess"; the rest stays at its default
    (max_active_runs 1, forwards, latest version, no conf override: the DAG's param defaults)."""
    return {
        "dag_id": dag_id,
        "dag_run_conf": None,
        "from_date": FROM_DATE,
        "max_active_runs": 1,
        "reprocess_behavior": reprocess,
        "run_backwards": False,
        "run_on_latest_version": True,
        "to_date": TO_DATE,
    }


def dry_run(api, body: dict) -> dict:
    """The dialog's preview ("N runs will be triggered"): the same form, without any conf."""
    return api.request("POST", "/api/v2/backfills/dry_run", {k: v for k, v in body.items() if k != "dag_run_conf"})


def run_dialog(api, body: dict, unpause: bool) -> dict:
    """The dialog's "Run" button."""
    if unpause:
        api.set_paused(body["dag_id"], False)
    return api.request("POST", "/api/v2/backfills", body)


def refusal(api, method: str, path: str, body: dict) -> str:
    """The error a call is refused with (the dialog shows it under the form)."""
    from primus_lib.airflow_api import AirflowApiError

    with pytest.raises(AirflowApiError) as refused:
        api.request(method, path, body)
    assert refused.value.status == 422
    return str(refused.value)


def _instant(text: str):
    from primus_lib.timegrid import parse_utc

    return parse_utc(text)


def job_state(spec) -> tuple[list[tuple[int, str, int]], dict]:
    """What the job consumed: the training queue (seq, window, rows) and the trainer's progress."""
    from primus_lib.data.training_queue import TrainingQueue
    from primus_lib.paths import JobPaths
    from primus_lib.progress import read_progress

    paths = JobPaths.for_job(spec)
    queued = [(w.seq, w.window, w.rows) for w in TrainingQueue(paths.ledger).windows("history")]
    return queued, read_progress(paths.progress)["consumed"]


@dataclass(frozen=True)
class Backfilled:
    """What the dialog's backfill of every window left, read right after it (later tests change the runs)."""

    server: object
    spec: object
    refused_none: str  # the dry run's answer to the dialog's default "missing runs only"
    preview: list[str]  # the dry run's logical dates
    backfill: dict
    runs: list[dict]  # the backfill's DAG runs, oldest first
    task_instances: list[dict[str, dict]]  # per run: task id -> task instance
    train_xcoms: list[dict]  # per run: the train task's return value
    queued: list[tuple[int, str, int]]  # the training queue: (seq, window, rows)
    consumed: dict[str, dict]  # the trainer's progress: window key -> metrics


@pytest.fixture(scope="module")
def backfilled(airflow_server) -> Backfilled:
    """Backfill every window of the job once from the UI's dialog, through the real deferred trainer."""
    from primus_lib.paths import parse_window_id
    from primus_lib.resources import backend_for
    from primus_lib.spec import load_job

    server, api = airflow_server, airflow_server.api()
    with pytest.MonkeyPatch.context() as mp:
        for key, value in server.job.env.items():
            mp.setenv(key, value)  # PRIMUS_HOME: where the job's state is
        spec = load_job(server.job.spec)
        dag = api.request("GET", f"/api/v2/dags/{spec.name}")
        refused = refusal(api, "POST", "/api/v2/backfills/dry_run", dialog_body(spec.name, "none"))
        body = dialog_body(spec.name, "failed")  # "Missing and errored runs"
        preview = [b["logical_date"] for b in dry_run(api, body)["backfills"]]
        try:
            backfill = run_dialog(api, body, unpause=dag["is_paused"])
            runs = api.wait_backfill(backfill["id"], spec.name, [parse_window_id(w) for w in WINDOWS], timeout=480)
            # as the dialog's user sees it done: Airflow marks it complete within 30 s of its last run
            api.await_backfill_complete(backfill["id"], 60)
        finally:
            backend_for(spec, str(server.job.spec)).stop()
        base = f"/api/v2/dags/{spec.name}/dagRuns"
        tis = [
            {
                ti["task_id"]: ti
                for ti in api.request("GET", f"{base}/{r['dag_run_id']}/taskInstances")["task_instances"]
            }
            for r in runs
        ]
        xcoms = [
            api.request("GET", f"{base}/{r['dag_run_id']}/taskInstances/train/xcomEntries/return_value")["value"]
            for r in runs
        ]
        queued, consumed = job_state(spec)
    return Backfilled(server, spec, refused, preview, backfill, runs, tis, xcoms, queued, consumed)


def test_the_dialogs_backfill_runs_the_windows_oldest_first_and_trains_each_once(backfilled):
    from primus_lib.paths import parse_window_id

    spec, api, runs = backfilled.spec, backfilled.server.api(), backfilled.runs
    # The dialog's default reprocess ("missing runs") is refused for the Sink's depends_on_past, with why.
    assert "depends_on_past" in backfilled.refused_none
    assert [_instant(d) for d in backfilled.preview] == [parse_window_id(w) for w in WINDOWS]
    assert [r["state"] for r in runs] == ["success"] * 3
    assert all(r["run_type"] == "backfill" for r in runs)
    for earlier, later in zip(runs, runs[1:], strict=False):  # one at a time (the dialog's default), oldest first
        assert _instant(later["start_date"]) >= _instant(earlier["end_date"])
    sinks = []
    for window, by_id, xcom in zip(WINDOWS, backfilled.task_instances, backfilled.train_xcoms, strict=True):
        assert by_id["train"]["state"] == "success"
        assert "auc=" in (by_id["train"]["note"] or "")  # the metrics on the task note (Grid view)
        assert xcom["window"] == window  # each run trained its own window
        sinks.append(_instant(by_id["history.sink"]["end_date"]))
    assert sinks == sorted(sinks)  # the sink committed the windows in time order
    # Each window queued once, in time order, and consumed by the trainer exactly once: every queued
    # row trained (samples = rows) and nothing else.
    assert [window for _, window, _ in backfilled.queued] == WINDOWS
    assert [seq for seq, _, _ in backfilled.queued] == sorted({seq for seq, _, _ in backfilled.queued})
    history = {k: v for k, v in backfilled.consumed.items() if k.startswith("history/")}
    assert sorted(history) == [f"history/{w}" for w in WINDOWS]
    assert [history[f"history/{w}"]["samples"] for _, w, _ in backfilled.queued] == [
        rows for _, _, rows in backfilled.queued
    ]
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
            dates = (
                conn.execute(
                    sa.text(
                        "SELECT logical_date FROM dag_run WHERE dag_id = :d AND run_type = 'backfill' "
                        "ORDER BY logical_date"
                    ),
                    {"d": backfilled.spec.name},
                )
                .scalars()
                .all()
            )
    finally:
        engine.dispose()
    assert [d.strftime("%Y%m%dT%H%M%SZ") for d in dates] == WINDOWS
    assert not (backfilled.server.home / "airflow.db").exists()


def test_a_second_dialog_backfill_of_the_same_range_retrains_nothing(backfilled, monkeypatch):
    server, spec, api = backfilled.server, backfilled.spec, backfilled.server.api()
    for key, value in server.job.env.items():
        monkeypatch.setenv(key, value)
    before = job_state(spec)
    assert before == (backfilled.queued, backfilled.consumed)  # what the first backfill left
    runs_before = {r["dag_run_id"]: r["end_date"] for r in api.dag_runs(spec.name)}
    # "Missing runs": refused outright (preview and run) for a DAG with depends_on_past.
    for path in ("/api/v2/backfills/dry_run", "/api/v2/backfills"):
        assert "depends_on_past" in refusal(api, "POST", path, dialog_body(spec.name, "none"))
    # "Missing and errored runs": nothing to run, the preview says so; run anyway, it creates no run.
    body = dialog_body(spec.name, "failed")
    assert dry_run(api, body)["total_entries"] == 0
    backfill = run_dialog(api, body, unpause=False)
    try:
        deadline = time.monotonic() + 120
        while not api.request("GET", f"/api/v2/backfills/{backfill['id']}").get("completed_at"):
            assert time.monotonic() < deadline, "the empty backfill never completed"
            time.sleep(2)
    finally:
        if not api.request("GET", f"/api/v2/backfills/{backfill['id']}").get("completed_at"):
            api.request("PUT", f"/api/v2/backfills/{backfill['id']}/cancel")  # never block later backfills
    assert {r["dag_run_id"]: r["end_date"] for r in api.dag_runs(spec.name)} == runs_before
    assert job_state(spec) == before  # nothing queued again, nothing trained again (same metrics, same times)


def _cli_backfill(server, *extra: str) -> subprocess.CompletedProcess:
    """``primus backfill --api`` with the password in a file (never in argv)."""
    secret = server.home / "primus-api-password"
    secret.write_text(server.password + "\n")
    secret.chmod(0o600)
    command = [
        sys.executable,
        "-m",
        "primus_lib.cli.main",
        "backfill",
        str(server.job.spec),
        "--api",
        server.url,
        "--password-file",
        str(secret),
        "--wait",
        "--timeout",
        "420",
        *extra,
    ]
    return subprocess.run(command, env=server.env, capture_output=True, text=True, timeout=480)


def test_rerunning_a_finished_window_through_the_cli_backfill_is_idempotent(backfilled, monkeypatch):
    from primus_lib.paths import JobPaths

    server, spec = backfilled.server, backfilled.spec
    for key, value in server.job.env.items():
        monkeypatch.setenv(key, value)
    paths = JobPaths.for_job(spec)
    before = job_state(spec)
    assert [window for _, window, _ in before[0]] == WINDOWS  # what the backfill committed
    manifest = Path(paths.window_dir("history", spec.spec.timer.start), "manifest.json").read_bytes()
    done = _cli_backfill(
        server, "--from", "2026-11-01T00:00Z", "--to", "2026-11-01T01:00Z", "--reprocess", "completed", "--mode", "skip"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "success" in done.stdout
    # at once another: `--wait` returned when the windows finished, before Airflow marked that backfill
    # complete (within 30 s), and Airflow runs one backfill of a DAG at a time: the second waits for the mark
    again = _cli_backfill(
        server, "--from", "2026-11-01T01:00Z", "--to", "2026-11-01T02:00Z", "--reprocess", "completed", "--mode", "skip"
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "1/1 windows finished, 1 success" in again.stdout
    assert job_state(spec) == before
    assert Path(paths.window_dir("history", spec.spec.timer.start), "manifest.json").read_bytes() == manifest


def test_a_triggered_run_is_named_after_its_window_in_the_grid(backfilled, monkeypatch):
    """The grid labels a run with its run_after (window end + lag) and shows its run id on hover."""
    server, spec, api = backfilled.server, backfilled.spec, backfilled.server.api()
    for key, value in server.job.env.items():
        monkeypatch.setenv(key, value)
    before = job_state(spec)
    # The Trigger form, with a logical date inside the 02:00 window (its start has the backfill's run).
    run = api.request(
        "POST", f"/api/v2/dags/{spec.name}/dagRuns", {"logical_date": "2026-11-01T02:30:00Z", "conf": {"mode": "skip"}}
    )
    assert run["dag_run_id"].startswith("manual__window_2026-11-01T02:00Z_at_")
    assert run["data_interval_start"].startswith("2026-11-01T02:00:00")
    deadline = time.monotonic() + 300
    while run["state"] not in ("success", "failed"):
        assert time.monotonic() < deadline, f"manual run still {run['state']}"
        time.sleep(2)
        run = api.request("GET", f"/api/v2/dags/{spec.name}/dagRuns/{run['dag_run_id']}")
    assert run["state"] == "success"
    grid = api.request("GET", f"/ui/grid/runs/{spec.name}", params={"limit": 20})
    ids = {r["run_id"]: r for r in grid}
    assert run["dag_run_id"] in ids
    assert all(r["dag_run_id"].startswith("backfill__") for r in backfilled.runs)  # Airflow 3.3 names backfill runs
    assert job_state(spec) == before  # the re-run window (mode skip) committed nothing twice
