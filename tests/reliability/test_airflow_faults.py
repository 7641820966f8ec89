"""Airflow's own processes killed mid-work: the scheduler in the middle of a backfill, the triggerer
while the ``train`` task is deferred. Everything must resume and complete in order, each window
trained exactly once: the (stream, id) multiset of the trainer's sample log (``--sample-log``, split
at any checkpoint a restarted trainer resumed from) equals the produced impressions' ids.

Airflow runs as in production (devstack.airflow: api-server, scheduler with the LocalExecutor,
dag-processor and triggerer as four processes, each in its own process group) on a PostgreSQL
metadata database, so one component can be killed (SIGKILL to its whole group: the scheduler takes
its LocalExecutor workers and their task processes with it) and started again. The scheduler's
recovery timers are shortened so the test waits seconds, not Airflow's production minutes: a task
whose process died is noticed after 20 s without heartbeat, a dead scheduler's queued tasks are
reset after 10 s.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from devstack.airflow import Airflow
from devstack.proc import poll_until
from primus_lib.paths import parse_window_id
from primus_lib.train.runtime.sample_log import read_sample_log
from tests.fixtures.airflow import airflow_binary, make_job, start_airflow_processes, stop_airflow_processes
from tests.fixtures.specs import write_spec

pytestmark = [pytest.mark.integration, pytest.mark.airflow, pytest.mark.slow]

WINDOWS = ["20261101T000000Z", "20261101T010000Z", "20261101T020000Z"]
PASSWORD = "primus-faults-admin"


@pytest.fixture
def airflow(tmp_path, postgres_server):
    """Our own four Airflow processes (so each can be killed), on a fresh PostgreSQL database."""
    airflow_binary()
    job = make_job(tmp_path / "job", name="af-faults", end="2026-11-01T03:00:00Z")
    with_sample_log(job.spec, job.root / "trained-ids.log")
    stack, env = start_airflow_processes(
        tmp_path,
        job,
        postgres_server.create_database("airflow_faults"),
        PASSWORD,
        timeout=240,
        AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT="20",
        AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL="5",
        AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD="10",
        AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL="10",
        AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT="60",
        AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD="10",
    )
    try:
        yield stack, env, job
    finally:
        from primus_lib.resources import backend_for
        from primus_lib.spec import load_job

        try:
            with pytest.MonkeyPatch.context() as mp:
                for key, value in job.env.items():
                    mp.setenv(key, value)
                backend_for(load_job(job.spec), str(job.spec)).stop()  # the job's trainer
        finally:
            stop_airflow_processes(stack)


def with_sample_log(spec: Path, log: Path) -> None:
    """The trainer role's command: the default ``primus train SPEC``, with its sample log; the train
    task defers at once (``trainer_wait: 0s``): the test kills the triggerer while it holds one."""
    command = [sys.executable, "-m", "primus_lib.cli.main", "train", "{SPEC}", "--sample-log", str(log)]
    doc = yaml.safe_load(spec.read_text())
    doc["spec"]["resources"]["roles"]["trainer"]["command"] = command
    doc["spec"]["airflow"]["trainer_wait"] = "0s"
    write_spec(spec, doc)


def produced_ids(data: Path, hours: list[datetime], stream: str = "history") -> Counter:
    """(stream, request_id) of every impression of ``hours``: the left join makes one sample each."""
    ids: Counter = Counter()
    for hour in hours:
        for path in sorted((data / "impressions" / f"{hour:%Y%m%d}" / f"{hour:%H}").glob("*.parquet")):
            ids.update((stream, i) for i in pq.read_table(path, columns=["request_id"]).column(0).to_pylist())
    return ids


def _kill(stack: Airflow, env: dict, name: str) -> None:
    """kill -9 one component's process group, then start it again (as its supervisor would)."""
    import signal

    assert stack.daemons[name].stop(signal.SIGKILL, timeout=10)
    time.sleep(2)
    stack.spawn(env)


def test_killed_scheduler_and_triggerer_resume_the_backfill_in_order_training_each_window_once(airflow):
    from primus_lib.airflow_api import AirflowApi
    from primus_lib.data.training_queue import TrainingQueue
    from primus_lib.paths import JobPaths
    from primus_lib.progress import read_progress
    from primus_lib.spec import load_job

    stack, env, job = airflow
    api = AirflowApi(stack.url, "admin", PASSWORD)
    poll_until(lambda: api.request("GET", f"/api/v2/dags/{job.name}"), "the DAG", 120)
    api.set_paused(job.name, False)
    body = {
        "dag_id": job.name,
        "from_date": "2026-11-01T00:00:00Z",
        "to_date": "2026-11-01T02:00:00Z",
        "max_active_runs": 1,
        "reprocess_behavior": "failed",
        "run_backwards": False,
    }
    backfill = api.request("POST", "/api/v2/backfills", body)
    base = f"/api/v2/dags/{job.name}/dagRuns"

    def train_of(run: dict) -> dict:
        return api.request("GET", f"{base}/{run['dag_run_id']}/taskInstances/train")

    def backfill_runs() -> list[dict]:
        return sorted(
            (r for r in api.dag_runs(job.name) if r.get("run_type") == "backfill"), key=lambda r: r["logical_date"]
        )

    # 1. the triggerer dies while the first window's train task is deferred
    poll_until(lambda: [r for r in backfill_runs()[:1] if train_of(r)["state"] == "deferred"], "a deferred train", 400)
    _kill(stack, env, "triggerer")

    def tasks_of(run: dict) -> list[dict]:
        return api.request("GET", f"{base}/{run['dag_run_id']}/taskInstances")["task_instances"]

    def second_run_working() -> list[str]:
        runs = backfill_runs()
        if len(runs) < 2:
            return []
        return [f"{t['task_id']}[{t['map_index']}]" for t in tasks_of(runs[1]) if t["state"] == "running"]

    # 2. the scheduler dies (with its executor's task processes) while the second window's tasks run
    interrupted = poll_until(second_run_working, "a running task of the second window", 400, poll=0.3)
    _kill(stack, env, "scheduler")
    runs = api.wait_backfill(backfill["id"], job.name, [parse_window_id(w) for w in WINDOWS], timeout=600)
    assert [r["state"] for r in runs] == ["success"] * len(WINDOWS), [(r["logical_date"], r["state"]) for r in runs]
    assert [r["logical_date"][:19] for r in runs] == [f"{parse_window_id(w):%Y-%m-%dT%H:%M:%S}" for w in WINDOWS]
    for earlier, later in zip(runs, runs[1:], strict=False):  # one at a time, oldest first
        assert later["start_date"] >= earlier["end_date"]
    with pytest.MonkeyPatch.context() as mp:
        for key, value in job.env.items():
            mp.setenv(key, value)
        paths = JobPaths.for_job(load_job(job.spec))
        queued = TrainingQueue(paths.ledger).windows("history")
        progress = read_progress(paths.progress)
    assert [w.window for w in queued] == WINDOWS  # each window committed and queued once, in time order
    consumed = {k: v for k, v in progress["consumed"].items() if k.startswith("history/")}
    assert sorted(consumed) == [f"history/{w}" for w in WINDOWS]
    trained = [consumed[f"history/{w.window}"]["samples"] for w in queued]
    assert trained == [w.rows for w in queued] and all(trained)  # per-window stats: every queued row once
    samples = read_sample_log((job.root / "trained-ids.log").read_text())
    counts = samples.count(produced_ids(job.data, [parse_window_id(w) for w in WINDOWS]))
    assert counts.exactly_once, counts  # by sample id, in the checkpointed model state
    assert set(samples.raw) == set(samples.kept)  # the raw step log: at least once, nothing else
    tries = {r["logical_date"][:13]: train_of(r)["try_number"] for r in runs}
    retried = {f"{t['task_id']}[{t['map_index']}]": t["try_number"] for t in tasks_of(runs[1]) if t["try_number"] > 1}
    print(
        f"\nairflow faults: {len(runs)} runs succeeded in order; samples queued {[w.rows for w in queued]}, "
        f"trained {trained}; by sample id: {counts}; trainer runs resumed at {samples.resumed_at}; train task "
        f"tries {tries}; trainer step {progress.get('step')}; running when the "
        f"scheduler was killed: {interrupted}; tasks of the second run tried again: {retried}"
    )
