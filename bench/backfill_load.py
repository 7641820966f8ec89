"""Load: one Airflow backfill of many windows through a real scheduler; does a window cost the same at
the end as at the start, and how fast do the metadata DB and the job's ledger grow?

    .venv/bin/python bench/backfill_load.py [--windows 500] [--budget S] [--parallelism 4]

Starts its own PostgreSQL (devstack.postgres, durable defaults) holding Airflow's metadata database
and the job's ledger + training queue (``spec.storage.database``: the production layout), and
Airflow 3.3 as api-server, scheduler (LocalExecutor), dag-processor and triggerer
(devstack.airflow). The job is the tests' two-source batch job (impressions left-join clicks, tiny
hourly partitions from ``primus datagen``'s generator) with 1h windows; the backfill
(``POST /api/v2/backfills``) runs every window through the real DAG with the trainer task in
``mode=skip`` (a DAG param: data only), so each window still costs its Airflow task processes (two
sources, two mapped data tasks, join, sink, train, scale) without the trainer's compute.

Per window: the completion interval (a run's end minus the previous run's end, runs in time order:
the backfill's throughput) and the run's duration, averaged over the first and the last 25 windows
(their ratio is the growth); Airflow rows per run (every metadata table with a ``run_id``);
pg_database_size of both databases and the ledger tables' rows/bytes at the start and the end,
sampled while the backfill runs for a linear fit (bytes per window). ``--budget`` seconds caps the
wait: windows unfinished by then are reported as such (the fit still holds). Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devstack.proc import poll_until  # noqa: E402
from primus_lib.naming import pool_name  # noqa: E402

NAME = "af-load"
START = datetime(2026, 1, 1, tzinfo=UTC)  # windows in the past: the scaler sensor ends at once
PASSWORD = "primus-load-admin"
LEDGER_TABLES = ("data_windows", "data_tasks", "data_executors", "stream_tasks", "training_queue")
EDGE = 25  # windows averaged at each end

SPEC = """\
apiVersion: primus.dev/v1alpha1
kind: PrimusJob
metadata: {{name: {name}}}
spec:
  timer: {{start: "{start}", end: "{end}", window: 1h, catchup: false}}
  storage: {{database: "{ledger}"}}
  dataset:
    streams:
      - name: history
        kind: batch
        sources:
          - {{name: impressions, uri: "file://{data}/impressions/{{YYYY}}{{MM}}{{DD}}/{{HH}}/", format: parquet, success_marker: _SUCCESS}}
          - {{name: clicks, uri: "file://{data}/clicks/{{YYYY}}{{MM}}{{DD}}/{{HH}}/", format: parquet, success_marker: _SUCCESS}}
        join: {{keys: [request_id], how: left, fill: {{clicked: 0}}}}
  features:
    label: clicked
    timestamp: ts
    sparse: [{{name: user_id, buckets: 1000}}, {{name: item_id, buckets: 1000}}, {{name: category, buckets: 100}}]
    dense: [price, age]
  model: {{embedding_dim: 8, memory_tower: [16], adapt_tower: [8]}}
  training: {{mode: offline, batch_size: 128}}
  resources:
    backend: local
    roles:
      data_executor: {{replicas: 4, cpu: 1, memory: 1Gi}}
      trainer: {{replicas: 1, cpu: 1, memory: 2Gi}}
"""


def iso(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def connect(url: str):
    """A psycopg2 connection (autocommit) from a SQLAlchemy URL."""
    import psycopg2

    conn = psycopg2.connect(url.replace("postgresql+psycopg2://", "postgresql://", 1))
    conn.autocommit = True
    return conn


def write_job(root: Path, windows: int, ledger_url: str, name: str = NAME, rows_per_hour: int = 20):
    """The job spec in its own jobs folder, ``windows`` hours of tiny partitions, a DAG folder copy."""
    from primus_lib.data.datagen import generate
    from tests.fixtures.airflow import AirflowJob, copy_dags

    jobs_dir, data, home, dags = root / "jobs", root / "data", root / "primus", root / "dags"
    jobs_dir.mkdir(parents=True)
    end = START + timedelta(hours=windows)
    text = SPEC.format(name=name, start=iso(START), end=iso(end), ledger=ledger_url, data=data)
    (jobs_dir / f"{name}.yaml").write_text(text)
    generate(data, START, end, rows_per_hour=rows_per_hour, seed=7)
    copy_dags(dags)
    env = {"PRIMUS_JOBS_DIR": str(jobs_dir), "PRIMUS_DATA": str(data), "PRIMUS_HOME": str(home)}
    return AirflowJob(root, name, jobs_dir, data, home, dags, env)


def start_airflow(root: Path, job, db_url: str, parallelism: int, **settings: str):
    """Airflow's four processes on ``db_url`` with ``parallelism`` task slots; returns (Airflow, env)."""
    from tests.fixtures.airflow import start_airflow_processes

    return start_airflow_processes(
        root,
        job,
        db_url,
        PASSWORD,
        AIRFLOW__CORE__PARALLELISM=str(parallelism),
        AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG=str(parallelism),
        AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT="1200",
        **settings,
    )


def stop_airflow(stack) -> None:
    from tests.fixtures.airflow import stop_airflow_processes

    stop_airflow_processes(stack)


# -- what is measured --------------------------------------------------------------------------
def db_sizes(airflow_url: str, ledger_url: str) -> dict:
    """pg_database_size of both databases; rows and bytes (table + indexes + toast) per ledger table."""
    out: dict = {}
    for key, url in (("airflow_db_bytes", airflow_url), ("ledger_db_bytes", ledger_url)):
        with connect(url) as conn, conn.cursor() as cur:
            cur.execute("SELECT pg_database_size(current_database())")
            out[key] = cur.fetchone()[0]
    tables = {}
    with connect(ledger_url) as conn, conn.cursor() as cur:
        for table in LEDGER_TABLES:
            cur.execute("SELECT to_regclass(%s)", (table,))
            if cur.fetchone()[0] is None:
                tables[table] = {"rows": 0, "bytes": 0}
                continue
            cur.execute(f"SELECT count(*), pg_total_relation_size('{table}') FROM {table}")
            rows, size = cur.fetchone()
            tables[table] = {"rows": rows, "bytes": size}
    out["ledger"] = tables
    return out


def rows_per_run(airflow_url: str) -> dict[str, dict[str, int]]:
    """run_id -> {table: rows} over every metadata table with a ``run_id`` column."""
    found: dict[str, dict[str, int]] = {}
    with connect(airflow_url) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT table_name FROM information_schema.columns WHERE column_name = 'run_id' "
            "AND table_schema = 'public' ORDER BY table_name"
        )
        for (table,) in cur.fetchall():
            cur.execute(f'SELECT run_id, count(*) FROM "{table}" GROUP BY run_id')
            for run_id, count in cur.fetchall():
                found.setdefault(str(run_id), {})[table] = count
    return found


def queued_windows(ledger_url: str) -> list[tuple[int, str]]:
    """The training queue: (seq, window), in queue order."""
    with connect(ledger_url) as conn, conn.cursor() as cur:
        cur.execute('SELECT seq, "window" FROM training_queue ORDER BY seq')
        return [(seq, window) for seq, window in cur.fetchall()]


def _utc(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


def window_times(runs: list[dict]) -> list[dict]:
    """Per finished run, oldest window first: duration (start->end) and interval (previous end -> end)."""
    done = sorted((r for r in runs if r.get("end_date") and r.get("start_date")), key=lambda r: r["logical_date"])
    out, previous = [], None
    for run in done:
        start, end = _utc(run["start_date"]), _utc(run["end_date"])
        interval = (end - previous).total_seconds() if previous else None
        out.append(
            {
                "run_id": run["dag_run_id"],
                "state": run["state"],
                "duration": (end - start).total_seconds(),
                "interval": interval,
            }
        )
        previous = end
    return out


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return round(sum(values) / len(values), 2) if values else None


def summarise(times: list[dict], edge: int = EDGE) -> dict:
    first, last = times[:edge], times[-edge:]
    first_interval, last_interval = _mean([t["interval"] for t in first]), _mean([t["interval"] for t in last])
    return {
        "first_interval_s": first_interval,
        "last_interval_s": last_interval,
        "first_duration_s": _mean([t["duration"] for t in first]),
        "last_duration_s": _mean([t["duration"] for t in last]),
        "growth_ratio": round(last_interval / first_interval, 3) if first_interval and last_interval else None,
    }


def fit(samples: list[dict], key: str) -> float | None:
    """Least-squares slope of ``key`` over finished windows (bytes per window)."""
    points = [(s["finished"], s[key]) for s in samples if s["finished"] > 0]
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return round(sum((x - mx) * (y - my) for x, y in points) / sxx, 1)


@dataclass
class Backfill:
    backfill_id: int
    runs: list[dict]
    samples: list[dict]  # over time: seconds, finished windows, both database sizes
    complete: bool


def run_backfill(
    api,
    name: str,
    windows: int,
    airflow_url: str,
    ledger_url: str,
    max_active_runs: int,
    budget: float,
    sample_every: float = 15.0,
    log: Callable[[str], None] = print,
) -> Backfill:
    """One backfill of the first ``windows`` windows (trainer mode skip), waited for at most ``budget`` s."""
    api.set_paused(name, False)
    api.set_pool_slots(pool_name(name), max(2, max_active_runs))
    body = {
        "dag_id": name,
        "from_date": iso(START),
        "to_date": iso(START + timedelta(hours=windows - 1)),
        "run_backwards": False,
        "reprocess_behavior": "failed",
        "max_active_runs": max_active_runs,
        "dag_run_conf": {"mode": "skip"},
    }
    backfill = api.create_backfill(body)
    began, samples, runs = time.monotonic(), [], []
    deadline, next_sample = began + budget, began
    while True:
        runs = [r for r in api.dag_runs(name) if r.get("run_type") == "backfill"]
        finished = sum(r["state"] in ("success", "failed") for r in runs)
        now = time.monotonic()
        if now >= next_sample or finished >= windows:
            sizes = db_sizes(airflow_url, ledger_url)
            samples.append(
                {
                    "seconds": round(now - began, 1),
                    "finished": finished,
                    "airflow_db_bytes": sizes["airflow_db_bytes"],
                    "ledger_db_bytes": sizes["ledger_db_bytes"],
                }
            )
            log(
                f"{now - began:7.0f}s  {finished}/{windows} windows  airflow db {sizes['airflow_db_bytes'] / 2**20:.1f} MiB"
            )
            next_sample = now + sample_every
        if finished >= windows or now > deadline:
            return Backfill(backfill["id"], runs, samples, finished >= windows)
        time.sleep(3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--windows",
        type=int,
        default=int(os.environ.get("PRIMUS_BENCH_WINDOWS", "500")),
        help="windows to backfill (default $PRIMUS_BENCH_WINDOWS or 500)",
    )
    parser.add_argument("--budget", type=float, help="seconds to wait for the backfill (default 300 + 15 per window)")
    parser.add_argument("--parallelism", type=int, default=4, help="Airflow task slots")
    parser.add_argument("--max-active-runs", type=int, default=4)
    parser.add_argument("--dir", type=Path, help="work directory (default: a temporary one, removed)")
    args = parser.parse_args(argv)
    if args.budget is None:
        args.budget = 300.0 + 15.0 * args.windows

    from devstack.postgres import ROLE, Postgres
    from devstack.proc import free_port
    from primus_lib.airflow_api import AirflowApi

    root = args.dir or Path(tempfile.mkdtemp(prefix="primus-load-"))
    root.chmod(0o755)  # as root the cluster belongs to the postgres user, who must enter it
    pg = Postgres(root / "pg", free_port(), root / "run", root / "logs")
    pg.start()
    stack = None
    try:
        pg._sql(f'CREATE DATABASE primus_ledger OWNER "{ROLE}"')
        airflow_url, ledger_url = pg.url, pg.url.rsplit("/", 1)[0] + "/primus_ledger"
        job = write_job(root / "job", args.windows, ledger_url)
        stack, _ = start_airflow(root / "airflow", job, airflow_url, args.parallelism)
        api = AirflowApi(stack.url, "admin", PASSWORD)
        poll_until(lambda: api.request("GET", f"/api/v2/dags/{NAME}"), "the DAG", 180)
        before = db_sizes(airflow_url, ledger_url)
        done = run_backfill(api, NAME, args.windows, airflow_url, ledger_url, args.max_active_runs, args.budget)
        after = db_sizes(airflow_url, ledger_url)
        times = window_times(done.runs)
        per_run = rows_per_run(airflow_url)
        rows = [sum(per_run.get(t["run_id"], {}).values()) for t in times]
        queued = queued_windows(ledger_url)
    finally:
        if stack is not None:
            stop_airflow(stack)
        pg.stop()
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    finished = [t for t in times if t["state"] in ("success", "failed")]
    summary = summarise(finished)
    result = {
        "bench": "backfill_load",
        "windows": args.windows,
        "finished": len(finished),
        "succeeded": sum(t["state"] == "success" for t in times),
        "complete": done.complete,
        "parallelism": args.parallelism,
        "max_active_runs": args.max_active_runs,
        **summary,
        "ratio": summary["growth_ratio"],  # the last windows' interval / the first windows'
        "airflow_rows_per_window_first": _mean(rows[:EDGE]),
        "airflow_rows_per_window_last": _mean(rows[-EDGE:]),
        "queued": len(queued),
        "queued_once": len({w for _, w in queued}) == len(queued),
        "airflow_db_bytes": [before["airflow_db_bytes"], after["airflow_db_bytes"]],
        "ledger_db_bytes": [before["ledger_db_bytes"], after["ledger_db_bytes"]],
        "ledger_tables_end": after["ledger"],
        "airflow_db_bytes_per_window": fit(done.samples, "airflow_db_bytes"),
        "ledger_db_bytes_per_window": fit(done.samples, "ledger_db_bytes"),
        "elapsed_s": done.samples[-1]["seconds"] if done.samples else None,
        "samples": done.samples,
    }
    print(json.dumps(result))
    return 0 if result["succeeded"] == len(finished) else 1


if __name__ == "__main__":
    sys.exit(main())
