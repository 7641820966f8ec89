"""Load, short: a 20-window backfill through a real scheduler (bench/backfill_load.py's setup: Airflow's
four processes, metadata DB and ledger on PostgreSQL, trainer mode ``skip``). The last windows must
cost what the first ones did (task instances and metadata rows per window; never wall-clock
times) and every window must be queued for training exactly once, in time order.
The 500-window version with timings and database sizes is ``bench/backfill_load.py``.
"""

from __future__ import annotations

import importlib.util
import sys
from datetime import timedelta
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.airflow, pytest.mark.postgres, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
WINDOWS, EDGE = 20, 5


def _bench():
    spec = importlib.util.spec_from_file_location("backfill_load", ROOT / "bench" / "backfill_load.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_a_backfill_costs_the_same_per_window_at_the_end_and_queues_each_window_once(tmp_path, postgres_server):
    from devstack.proc import poll_until
    from primus_lib.airflow_api import AirflowApi
    from primus_lib.paths import window_id
    from tests.fixtures.airflow import airflow_binary

    load = _bench()
    airflow_binary()
    airflow_url = postgres_server.create_database("load_airflow")
    ledger_url = postgres_server.create_database("load_ledger")
    job = load.write_job(tmp_path / "job", WINDOWS, ledger_url)
    stack, _ = load.start_airflow(tmp_path / "airflow", job, airflow_url, parallelism=3)
    try:
        api = AirflowApi(stack.url, "admin", load.PASSWORD)
        poll_until(lambda: api.request("GET", f"/api/v2/dags/{load.NAME}"), "the DAG", 180)
        before = load.db_sizes(airflow_url, ledger_url)
        done = load.run_backfill(
            api, load.NAME, WINDOWS, airflow_url, ledger_url, max_active_runs=3, budget=900, log=lambda _line: None
        )
        after = load.db_sizes(airflow_url, ledger_url)
        per_run = load.rows_per_run(airflow_url)
        queued = load.queued_windows(ledger_url)
    finally:
        load.stop_airflow(stack)

    assert done.complete, f"{sum(r['state'] in ('success', 'failed') for r in done.runs)}/{WINDOWS} windows finished"
    runs = sorted(done.runs, key=lambda r: r["logical_date"])
    assert [r["state"] for r in runs] == ["success"] * WINDOWS
    # the same work per window at the end as at the start: task instances exactly, metadata rows
    # (every table with a run_id) within noise (a retried task adds a history row)
    tasks = [per_run[r["dag_run_id"]]["task_instance"] for r in runs]
    assert tasks[-EDGE:] == tasks[:EDGE] and len(set(tasks)) == 1, tasks
    rows = [sum(per_run[r["dag_run_id"]].values()) for r in runs]
    first, last = sum(rows[:EDGE]) / EDGE, sum(rows[-EDGE:]) / EDGE
    assert last <= first * 1.1 + 1, rows
    # each window queued once, in time order; the ledger holds one planned window per window
    expected = [window_id(load.START + timedelta(hours=h)) for h in range(WINDOWS)]
    assert [w for _, w in queued] == expected
    assert [s for s, _ in queued] == sorted({s for s, _ in queued})
    assert after["ledger"]["data_windows"]["rows"] == WINDOWS
    assert after["ledger"]["training_queue"]["rows"] == WINDOWS
    assert after["airflow_db_bytes"] > before["airflow_db_bytes"]  # sizes are read from the real databases
