"""primus_lib.jobview against a job directory built here the way the roles write it: the task
ledger and training queue (SQLite), progress.json, a trainer's metric snapshot, the scaler's
decisions. What the Primus view of the Airflow UI shows comes from these functions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from primus_lib.allocation import allocations_dir
from primus_lib.data.ledger import TaskLedger
from primus_lib.data.task import DataTask
from primus_lib.data.training_queue import TrainingQueue
from primus_lib.jobview import executor_series, job_view, mermaid_of, window_metrics, window_of_run
from primus_lib.metrics.instruments import TrainerMetrics
from primus_lib.metrics.reporting import write_snapshot_to
from primus_lib.paths import JobPaths
from primus_lib.progress import write_progress
from primus_lib.scaling.store import ScalingStore
from primus_lib.spec import load_job
from tests.fixtures.specs import airflow_doc, write_spec

W0, W1, W2, W3 = "20261101T000000Z", "20261101T010000Z", "20261101T020000Z", "20261101T030000Z"


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path / "home"))
    spec = write_spec(tmp_path / "view-job.yaml", airflow_doc("view-job"))
    return load_job(spec, env={"PRIMUS_DATA": str(tmp_path / "data")})


def _task(window: str, source: str, n: int) -> DataTask:
    path = f"/data/{source}/{window}/part-{n}.parquet"
    return DataTask(f"history/{source}/{window}/{n}", "history", source, window, "file://" + path, path, "parquet", 10)


def test_a_job_before_any_run_has_no_windows_and_creates_no_state(job):
    view = job_view(job, now=1000.0)
    paths = JobPaths.for_job(job)
    assert not paths.root.exists()  # the view read nothing into existence (no SQLite ledger)
    assert view["windows"] == [] and view["metrics"] == []
    assert view["trainer"]["lag_windows"] == 0 and view["trainer"]["input_wait"] is None
    executors = view["executors"]["data_executor"]
    assert executors["replicas"] == 2 and executors["series"] == [{"at": None, "replicas": 2, "action": "spec"}]
    assert executors["decisions"] == [] and (executors["cpu"], executors["memory"]) == (1.0, 2**30)
    nodes = {n["id"]: n["column"] for n in view["dtgg"]["graph"]["nodes"]}
    assert nodes == {
        "timer": 0,
        "history/join": 3,
        "history/sink": 4,
        "history/impressions": 1,
        "history/impressions/tasks": 2,
        "history/clicks": 1,
        "history/clicks/tasks": 2,
        "trainer": 5,
    }
    assert {"from": "history/sink", "to": "trainer"} in view["dtgg"]["graph"]["edges"]
    assert json.loads(json.dumps(view)) == view  # what the endpoint returns: plain JSON


def test_each_window_shows_how_far_it_got_with_its_run_and_metrics(job):
    paths = JobPaths.for_job(job)
    paths.root.mkdir(parents=True)
    ledger = TaskLedger(paths.ledger)
    for window in (W0, W1, W2):
        ledger.add_window("history", window, [_task(window, "impressions", 0), _task(window, "clicks", 0)])
    for _ in range(2):  # W0's two tasks done
        task = ledger.claim("e1", "history", W0)
        ledger.succeed(task.id, "e1", {"rows": 5})
    queue = TrainingQueue(paths.ledger)
    queue.append("history", W0, "/w0", 300)
    queue.append("history", W1, "/w1", 280)
    consumed = {f"history/{W0}": {"samples": 300, "auc": 0.61, "logloss": 0.52, "at": 50.0}}
    write_progress(paths.progress, consumed, step=3, stream_position={}, mode="offline")
    runs = [
        {"window": W0, "run_id": "r0", "state": "success", "run_type": "backfill", "start_date": "a", "end_date": "b"},
        {"window": W1, "run_id": "r1", "state": "running", "run_type": "backfill", "start_date": "c", "end_date": None},
        {"window": W3, "run_id": "r3", "state": "queued", "run_type": "scheduled", "start_date": None, "end_date": None},
    ]  # fmt: skip # a table: one run per row, the same keys in the same columns

    view = job_view(job, runs, now=1000.0)

    rows = {w["window"]: w for w in view["windows"]}
    assert [w["window"] for w in view["windows"]] == [W0, W1, W2, W3]
    assert {w: r["state"] for w, r in rows.items()} == {W0: "trained", W1: "committed", W2: "planned", W3: "waiting"}
    assert rows[W0]["run"]["state"] == "success" and rows[W3]["run"]["run_id"] == "r3" and rows[W2]["run"] is None
    assert rows[W0]["streams"]["history"] == {"tasks": {"succeeded": 2}, "committed_rows": 300, "trained": True}
    assert rows[W2]["streams"]["history"]["tasks"] == {"pending": 2}
    assert rows[W0]["samples"] == 300 and rows[W1]["samples"] is None
    assert view["metrics"] == [
        {
            "stream": "history",
            "window": W0,
            "start": "2026-11-01T00:00:00+00:00",
            "auc": 0.61,
            "logloss": 0.52,
            "samples": 300,
            "at": 50.0,
        }
    ]
    trainer = view["trainer"]
    assert (trainer["lag_windows"], trainer["untrained"], trainer["lag_seconds"]) == (1, [f"history/{W1}"], 3600.0)
    assert (trainer["newest_trained"], trainer["newest_committed"], trainer["step"]) == (W0, W1, 3)


def test_the_trainer_input_wait_comes_from_its_metric_snapshots(job):
    paths = JobPaths.for_job(job)
    for rank, (wait, full) in enumerate([(0.25, 0.5), (0.4, 0.1)]):
        registry = CollectorRegistry()
        TrainerMetrics(job.name, str(rank), registry=registry).observe_step(wait, 1.0, full)
        write_snapshot_to(paths.metrics_dir, f"trainer-{rank}", registry)
    other = CollectorRegistry()  # another job's trainer in the same directory is not this job's
    TrainerMetrics("someone-else", "0", registry=other).observe_step(0.9, 1.0, 0.9)
    write_snapshot_to(paths.metrics_dir, "trainer-other", other)

    trainer = job_view(job, now=1000.0)["trainer"]

    assert (trainer["input_wait"], trainer["backpressure"]) == (0.4, 0.5)  # the most starved rank
    assert trainer["metrics_at"] > 0


def test_scaling_decisions_give_the_executor_count_over_time_with_their_inputs(job):
    store = ScalingStore(allocations_dir(job) / "data_executor")
    inputs = {"buffer": 0.05, "executors": 2, "trainer_starved": 0.6, "load": 1.4}
    store.record(
        {
            "policy": "horizontal",
            "action": "scale_up",
            "role": "data_executor",
            "replicas": 3,
            "cpu": None,
            "memory": None,
            "reason": "trainer starved",
            "inputs": inputs,
            "at": 200.0,
        }
    )
    store.record(
        {
            "policy": "vertical",
            "action": "resize",
            "role": "data_executor",
            "replicas": None,
            "cpu": 2.0,
            "memory": 2**31,
            "reason": "cpu",
            "inputs": {"cpu": 0.95},
            "at": 300.0,
        }
    )
    store.save({"allocation": {"replicas": 3, "cpu": 2.0, "memory": 2**31}})

    executors = job_view(job, now=1000.0)["executors"]["data_executor"]

    assert executors["replicas"] == 3
    assert executors["series"] == [
        {"at": None, "replicas": 2, "action": "spec"},
        {"at": 200.0, "replicas": 3, "action": "scale_up"},
    ]
    assert [d["inputs"] for d in executors["decisions"]] == [inputs, {"cpu": 0.95}]
    assert job_view(job, pool_slots=4, now=1000.0)["executors"]["data_executor"]["replicas"] == 4  # the pool: Airflow's


def test_the_timer_windows_that_started_are_listed_waiting(job):
    from datetime import UTC, datetime

    from primus_lib.jobview import grid_windows

    now = datetime(2026, 11, 1, 2, 30, tzinfo=UTC).timestamp()
    assert [(w["window"], w["state"], w["run"]) for w in job_view(job, now=now)["windows"]] == [
        (W0, "waiting", None),
        (W1, "waiting", None),
        (W2, "waiting", None),
    ]
    later = datetime(2026, 12, 1, tzinfo=UTC).timestamp()
    assert [w["window"] for w in job_view(job, now=later)["windows"]] == [W0, W1, W2, W3]  # the timer ends at 04:00
    assert grid_windows(job, later, limit=2) == [W2, W3]  # the newest only


def test_executor_series_orders_decisions_by_time():
    decisions = [{"at": 9.0, "replicas": 1, "action": "scale_down"}, {"at": 5.0, "replicas": 4, "action": "scale_up"}]
    assert [p["replicas"] for p in executor_series(2, decisions)] == [2, 4, 1]


def test_mermaid_is_taken_from_the_dag_docs():
    doc = "### Primus job `j`\n\n```mermaid\nflowchart LR\n  a --> b\n```\n| stream | kind |\n"
    assert mermaid_of(doc) == "flowchart LR\n  a --> b"
    assert mermaid_of("no diagram") is None and mermaid_of(None) is None


def test_a_run_names_its_window_by_conf_or_data_interval():
    from datetime import UTC, datetime

    start = datetime(2026, 11, 1, 2, tzinfo=UTC)
    assert window_of_run(start, start, {}) == W2
    assert window_of_run(None, start, None) == W2
    assert window_of_run(start, start, {"window_start": "2026-11-01T03:00:00Z"}) == W3
    assert window_of_run(None, None, {}) is None


def test_a_malformed_progress_entry_is_named():
    with pytest.raises(ValueError, match=r"progress.json: consumed\['history/20261101T000000Z'\]: expected an object"):
        window_metrics({f"history/{W0}": 0.5})
