"""Airflow's metadata PostgreSQL restarted under load: a backfill through a real scheduler (the
load test's setup, bench/backfill_load.py: Airflow's four processes, metadata DB and the job's
ledger on one PostgreSQL, trainer mode ``skip``) loses its database for a while, with an immediate
shutdown (no shutdown checkpoint: crash recovery on start), once some windows have finished.

The cluster is our own (devstack.postgres, durable defaults), so it can be stopped and started on
the same port and data directory. Airflow's processes are watched by a supervisor as production
runs them (systemd ``Restart=always``, a Kubernetes Deployment): one that exits is started again
after a short pause. The backfill must complete, every window's run succeed, each window be queued
for training exactly once, in time order, and no run be duplicated. Then a ``primus train`` over
the queue (the backfill ran ``mode=skip``: data only) must train every produced sample id exactly
once, counted from its sample log against the impressions' ids.
The scheduler's recovery timers are shortened as in test_airflow_faults.py (seconds, not minutes).
"""

from __future__ import annotations

import collections
import os
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from devstack.postgres import ROLE
from primus_lib.train.runtime.sample_log import read_sample_log
from tests.fixtures.postgres import own_cluster
from tests.reliability.test_airflow_faults import produced_ids
from tests.reliability.test_load import _bench

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.airflow, pytest.mark.postgres, pytest.mark.slow]

WINDOWS, FINISHED_BEFORE, DOWN_S = 8, 2, 15.0
RESTART_PAUSE_S = 3.0  # the supervisor's pause before starting an exited component (RestartSec)
SHORT_TIMERS = {
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "10",
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "10",
    "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "10",
}


@pytest.fixture
def pg(tmp_path):
    with own_cluster(tmp_path, "pg-meta-secret") as server:
        server._sql(f'CREATE DATABASE primus_ledger OWNER "{ROLE}"')
        yield server


class Supervisor(threading.Thread):
    """Starts every Airflow component that has exited, after a pause; counts the restarts."""

    def __init__(self, stack, env: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.stack, self.env = stack, env
        self.restarts: collections.Counter = collections.Counter()
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(RESTART_PAUSE_S):
            for name, daemon in self.stack.daemons.items():
                if daemon.pid() is None and not self.halt.is_set():
                    daemon.spawn([str(self.stack.binary), name], self.env, cwd=self.stack.home)
                    self.restarts[name] += 1


def _runs(api, name: str) -> list[dict] | None:
    """The backfill's runs, or None while the API cannot answer (its database is down)."""
    try:
        return [r for r in api.dag_runs(name) if r.get("run_type") == "backfill"]
    except Exception:
        return None


def test_a_restarted_metadata_database_loses_and_repeats_no_window(tmp_path, pg):
    from devstack.proc import poll_until
    from primus_lib.airflow_api import AirflowApi
    from primus_lib.paths import window_id
    from tests.fixtures.airflow import airflow_binary

    load = _bench()
    airflow_binary()
    airflow_url, ledger_url = pg.url, pg.url.rsplit("/", 1)[0] + "/primus_ledger"
    job = load.write_job(tmp_path / "job", WINDOWS, ledger_url)
    stack, env = load.start_airflow(tmp_path / "airflow", job, airflow_url, parallelism=3, **SHORT_TIMERS)
    supervisor = Supervisor(stack, env)
    supervisor.start()
    try:
        api = AirflowApi(stack.url, "admin", load.PASSWORD)
        poll_until(lambda: api.request("GET", f"/api/v2/dags/{load.NAME}"), "the DAG", 180)
        api.set_paused(load.NAME, False)
        api.set_pool_slots(f"primus-{load.NAME}", 3)
        body = {
            "dag_id": load.NAME,
            "from_date": load.iso(load.START),
            "to_date": load.iso(load.START + timedelta(hours=WINDOWS - 1)),
            "run_backwards": False,
            "reprocess_behavior": "failed",
            "max_active_runs": 3,
            "dag_run_conf": {"mode": "skip"},
        }
        api.create_backfill(body)

        def finished(runs: list[dict] | None) -> int:
            return sum(r["state"] in ("success", "failed") for r in runs or [])

        poll_until(lambda: finished(_runs(api, load.NAME)) >= FINISHED_BEFORE, "the first windows", 600, poll=1)
        at_stop = _runs(api, load.NAME)
        assert pg.daemon.stop(signal.SIGQUIT, timeout=60, group=False)  # immediate shutdown: crash recovery
        time.sleep(DOWN_S)
        pg.start()
        back = time.monotonic()
        poll_until(lambda: finished(_runs(api, load.NAME)) >= WINDOWS, "the whole backfill", 900, poll=3)
        rest = time.monotonic() - back
        runs = sorted(_runs(api, load.NAME), key=lambda r: r["logical_date"])
    finally:
        supervisor.halt.set()
        supervisor.join(timeout=30)
        load.stop_airflow(stack)
    queued = load.queued_windows(ledger_url)
    with load.connect(airflow_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT task_id, map_index, try_number FROM task_instance WHERE try_number > 1")
        retried = sorted(f"{task}[{index}] try {tries}" for task, index, tries in cur.fetchall())
        cur.execute(
            "SELECT run_id, task_id, map_index, state, try_number FROM task_instance"
            " WHERE state IS NULL OR state NOT IN ('success', 'skipped') ORDER BY run_id, task_id"
        )
        unfinished = [f"{run} {task}[{index}] {state} try {tries}" for run, task, index, state, tries in cur.fetchall()]
    sizes = load.db_sizes(airflow_url, ledger_url)
    with load.connect(ledger_url) as conn, conn.cursor() as cur:
        cur.execute('SELECT "window", rows FROM training_queue ORDER BY seq')
        rows_queued = dict(cur.fetchall())

    expected = [window_id(load.START + timedelta(hours=h)) for h in range(WINDOWS)]
    produced = {}
    for h in range(WINDOWS):  # impressions left-join clicks: one sample per impression of the hour
        hour = load.START + timedelta(hours=h)
        files = sorted((job.data / "impressions" / f"{hour:%Y%m%d}" / f"{hour:%H}").glob("*.parquet"))
        produced[window_id(hour)] = sum(pq.read_metadata(f).num_rows for f in files)
    print(
        f"\nmetadata restart: {finished(at_stop)} of {WINDOWS} windows done at the stop, down {DOWN_S:.0f}s; "
        f"supervisor restarts {dict(supervisor.restarts)}; the other windows done {rest:.0f}s after it was back; "
        f"runs {collections.Counter(r['state'] for r in runs)}; tasks tried again {retried}; "
        f"samples produced {sum(produced.values())}, queued {sum(rows_queued.values())}"
    )
    assert len(runs) == WINDOWS and len({r["logical_date"] for r in runs}) == WINDOWS  # no run duplicated
    states = [(r["logical_date"], r["state"]) for r in runs]
    assert [r["state"] for r in runs] == ["success"] * WINDOWS, (
        states,
        unfinished,
        f"logs under {tmp_path / 'airflow'}",
    )
    assert [w for _, w in queued] == expected  # each window queued once, in time order
    assert [s for s, _ in queued] == sorted({s for s, _ in queued})
    assert rows_queued == produced  # every produced sample's row queued (row counts)
    trained = _train_the_queue(job, tmp_path / "trained-ids.log", expected[-1])
    counts = trained.count(produced_ids(job.data, [load.START + timedelta(hours=h) for h in range(WINDOWS)]))
    print(f"metadata restart, trained afterwards by sample id: {counts}")
    assert counts.exactly_once, counts  # by sample id: none lost, none twice
    assert trained.resumed_at == [0] and not trained.replayed  # one trainer run, nothing replayed
    assert sizes["ledger"]["data_windows"]["rows"] == WINDOWS
    assert FINISHED_BEFORE <= finished(at_stop) < WINDOWS  # the outage came mid-backfill


def _train_the_queue(job, log: Path, last: str):
    """``primus train --until-window LAST --sample-log LOG`` over what the backfill queued."""
    import subprocess
    import sys

    env = {**os.environ, **job.env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    args = [
        sys.executable,
        "-m",
        "primus_lib.cli.main",
        "train",
        str(job.spec),
        "--until-window",
        last,
        "--poll-interval",
        "0.2",
        "--sample-log",
        str(log),
    ]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return read_sample_log(log.read_text())


WAITER = r"""
import sys
from primus_lib.data.training_queue import TrainingQueue
print(len(TrainingQueue(sys.argv[1]).windows("history")), "windows", flush=True)
"""


def test_a_new_process_waits_out_a_database_restart(pg):
    """Every Airflow task is a new process: one that starts while PostgreSQL restarts waits for it
    (primus_lib.data.db.RETRY_SECONDS) instead of failing its try at once (found by the backfill above)."""
    import subprocess
    import sys

    ledger_url = pg.url.rsplit("/", 1)[0] + "/primus_ledger"
    assert pg.daemon.stop(signal.SIGQUIT, timeout=60, group=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the task waits out the outage (120 s bound)
    args = [sys.executable, "-c", WAITER, ledger_url]
    task = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(4)  # the task tries while the server is down
        assert task.poll() is None, task.communicate()[1][-2000:]
        pg.start()
        out, err = task.communicate(timeout=120)
    finally:
        if task.poll() is None:
            task.kill()
            task.wait(30)
    assert task.returncode == 0 and out.strip() == "0 windows", err[-2000:]
    assert "database connection lost" in err and pg.password not in err  # it retried, saying so
