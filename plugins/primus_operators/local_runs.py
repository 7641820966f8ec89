"""Run consecutive windows of a Primus DAG in this process with ``dag.test()``.

The embedded default's way to run a job without a scheduler (``make demo``, tests): the same
DAG, operators, triggers and deferrals as production, one run after another, in time order.
Airflow binds its configuration and metadata DB at import, so set ``AIRFLOW_HOME`` (and run
``airflow db migrate``) before calling.

    python -m primus_operators.local_runs --dag-id ctr-demo --windows 6 [--mode service] [--json OUT]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from primus_lib import timegrid
from primus_lib.naming import MODE_PARAM, TRAIN_TASK, jobs_dir, pool_name, spec_files


@dataclass
class WindowRun:
    window: str
    mode: str
    state: str
    tasks: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, Any] | None = None


def run_windows(dags_folder: str, dag_id: str, runs: list[tuple[datetime, str]]) -> list[WindowRun]:
    """Run ``(window start, trainer mode)`` pairs in order; stop at the first failed window."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from primus_operators.listeners import ensure_pool, pool_size

    bag = DagBag(dag_folder=dags_folder)
    if bag.import_errors:
        raise RuntimeError("DAG import errors:\n" + "\n".join(f"{k}: {v}" for k, v in bag.import_errors.items()))
    if dag_id not in bag.dags:
        raise RuntimeError(f"no DAG {dag_id!r} in {dags_folder} (found: {', '.join(sorted(bag.dags))})")
    dag = bag.dags[dag_id]
    ensure_pool(pool_name(dag_id), pool_size(dag_id))
    report = []
    for start, mode in runs:
        run = dag.test(logical_date=start, run_conf={MODE_PARAM: mode})
        with create_session() as session:
            tasks = {f"{ti.task_id}[{ti.map_index}]": str(ti.state) for ti in run.get_task_instances(session=session)}
            row = session.scalars(
                select(XComModel).where(
                    XComModel.dag_id == dag_id,
                    XComModel.run_id == run.run_id,
                    XComModel.task_id == TRAIN_TASK,
                    XComModel.key == "return_value",
                )
            ).first()
            metrics = XComModel.deserialize_value(row) if row is not None else None
        report.append(WindowRun(start.isoformat(), mode, str(run.state), tasks, metrics))
        if str(run.state) != "success":
            break
    return report


def _windows(dag_id: str, first: str | None, count: int) -> list[datetime]:
    """``count`` window starts of the job from the window holding ``first`` (default: the timer's start)."""
    from primus_lib.spec import load_job

    for path in spec_files():
        job = load_job(path)
        if job.name == dag_id:
            timer = job.spec.timer
            begin = timegrid.parse_utc(first, "--from") if first else timer.start
            begin = timegrid.floor(max(begin, timer.start), timer.window_size, timer.start)
            return list(
                itertools.islice(timegrid.window_starts(begin, timer.end, timer.window_size, timer.start), count)
            )
    raise RuntimeError(f"no spec with metadata.name {dag_id!r} in {jobs_dir()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m primus_operators.local_runs", description=__doc__.split("\n")[0])
    parser.add_argument("--dag-id", required=True)
    parser.add_argument("--dags-folder", help="the DAG folder (default: Airflow's [core] dags_folder)")
    parser.add_argument("--from", dest="first", help="ISO start of the first window (default: the timer's start)")
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--mode", default="service", choices=["service", "inline", "skip"])
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args(argv)
    try:
        starts = _windows(args.dag_id, args.first, args.windows)
    except ValueError as exc:  # a bad --from
        parser.error(str(exc))
    if args.dags_folder is None:
        from airflow.configuration import conf

        args.dags_folder = conf.get("core", "dags_folder")
    report = run_windows(args.dags_folder, args.dag_id, [(s, args.mode) for s in starts])
    print(f"{'window':<27} {'state':<8} {'samples':>8} {'auc':>7} {'logloss':>8}")
    for run in report:
        m = run.metrics or {}
        auc = f"{m['auc']:.4f}" if m.get("auc") is not None else "-"
        loss = f"{m['logloss']:.4f}" if m.get("logloss") is not None else "-"
        print(f"{run.window:<27} {run.state:<8} {m.get('samples', '-'):>8} {auc:>7} {loss:>8}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump([asdict(r) for r in report], handle, indent=1, default=str)
    ok = len(report) == len(starts) and all(r.state == "success" for r in report)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
