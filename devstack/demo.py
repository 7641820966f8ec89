"""The two steps of ``make demo`` around its backfill (scripts/demo.sh), against the live stack.

    python -m devstack.demo reset SPEC      # a clean slate for the job: runs, state, data, topic
    python -m devstack.demo report SPEC --from A --to B --eval DIR

``reset`` waits until the dag-processor has parsed the job's DAG, then removes what an earlier
demo left: its DAG runs (the API), its roles (local backend) and state under $PRIMUS_HOME, its
data under $PRIMUS_DATA and its Kafka topics, so each ``make demo`` trains from scratch.
``report`` prints AUC and logloss per window: MTRM as the live trainer scored each hour's stream
rows before training on them (its progress.json), next to the baselines of ``primus eval`` over
the same hours (its report.json), and the live trainer's score of each batch window (the
``train`` task's XCom, read through Airflow's API). Reads ``source <stack>/env.sh``'s variables.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from datetime import datetime
from pathlib import Path

from primus_lib.airflow_api import AirflowApi, AirflowApiError
from primus_lib.spec import PrimusJob, load_job
from primus_lib.timegrid import parse_utc

NAME = "devstack.demo"


def api() -> AirflowApi:
    return AirflowApi(
        os.environ["PRIMUS_AIRFLOW_API"],
        os.environ.get("PRIMUS_AIRFLOW_USER", "admin"),
        os.environ["PRIMUS_AIRFLOW_PASSWORD"],
    )


def wait_for_dag(client: AirflowApi, dag_id: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            client.request("GET", f"/api/v2/dags/{dag_id}")
            return
        except AirflowApiError:
            time.sleep(1)
    errors = client.request("GET", "/api/v2/importErrors")
    raise RuntimeError(f"DAG {dag_id} not parsed within {timeout:.0f}s; import errors: {json.dumps(errors)[:2000]}")


def reset(job: PrimusJob, spec: str) -> None:
    from primus_lib.paths import JobPaths
    from primus_lib.resources import backend_for

    client = api()
    wait_for_dag(client, job.name)
    client.set_paused(job.name, True)
    # an interrupted demo's, or the last one's, which Airflow marks complete up to 30 s after its last run
    # (`primus backfill --wait` returns before): Airflow runs one backfill of a DAG at a time
    backfill = client.latest_backfill(job.name)
    if backfill is not None and not backfill.get("completed_at"):
        try:
            client.request("PUT", f"/api/v2/backfills/{backfill['id']}/cancel")
        except AirflowApiError as exc:
            if exc.status != 409:  # 409: marked complete meanwhile
                raise
    runs = client.dag_runs(job.name)
    for run in runs:
        client.request("DELETE", f"/api/v2/dags/{job.name}/dagRuns/{run['dag_run_id']}")
    if job.spec.resources.backend == "local":
        backend_for(job, spec).stop()
    shutil.rmtree(JobPaths.for_job(job).root, ignore_errors=True)
    data = Path(os.environ["PRIMUS_DATA"])
    for sub in ("impressions", "clicks", "stream"):
        shutil.rmtree(data / sub, ignore_errors=True)
    topics = _delete_topics(job)
    print(f"{job.name}: removed {len(runs)} earlier DAG runs, the job's state, data and topics {', '.join(topics)}")


def _delete_topics(job: PrimusJob) -> list[str]:
    from confluent_kafka.admin import AdminClient

    from primus_lib.data.sources.kafka import client_config

    deleted = []
    for stream in job.stream_streams:
        for source in stream.sources:
            if source.kafka is None:
                continue
            admin = AdminClient(client_config(stream, source))  # the source's own login
            existing = set(admin.list_topics(timeout=10).topics)
            names = [t for t in (source.kafka.topic, f"{source.kafka.topic}.dlq") if t in existing]
            if not names:  # a fresh broker: nothing to delete
                continue
            for name, future in admin.delete_topics(names, operation_timeout=30).items():
                future.result()
                deleted.append(name)
            deadline = time.monotonic() + 30  # gone before datagen creates it again
            while set(names) & set(admin.list_topics(timeout=10).topics) and time.monotonic() < deadline:
                time.sleep(0.2)
    return deleted


def live_metrics(job: PrimusJob, start: datetime, end: datetime) -> dict[datetime, dict]:
    """Window start -> the ``train`` task's return value (the live trainer's metrics of it)."""
    client, out = api(), {}
    for run in client.dag_runs(job.name):
        when = parse_utc(run["logical_date"], "logical_date")
        if not start <= when < end or run["state"] != "success":
            continue
        path = f"/api/v2/dags/{job.name}/dagRuns/{run['dag_run_id']}/taskInstances/train/xcomEntries/return_value"
        value = client.request("GET", path)["value"]
        out[when] = json.loads(value) if isinstance(value, str) else value
    return out


def trainer_progress(job: PrimusJob) -> dict:
    from primus_lib.paths import JobPaths
    from primus_lib.progress import read_progress

    return read_progress(JobPaths.for_job(job).progress)


def stream_metrics(progress: dict, job: PrimusJob, start: datetime, end: datetime) -> dict[datetime, dict]:
    """Window start -> the live trainer's progressive scores of that hour's stream rows (scored before
    it trained on them, against their real-time labels; ``primus eval`` scores against the complete
    label, which a live trainer learns only a day later)."""
    from primus_lib.paths import parse_window_id

    consumed = progress["consumed"]
    names = {stream.name for stream in job.stream_streams}
    out = {}
    for key, summary in consumed.items():
        stream, _, window = key.partition("/")
        when = parse_window_id(window) if stream in names else None
        if when is not None and start <= when < end:
            out[when] = summary
    return out


def report(job: PrimusJob, start: datetime, end: datetime, eval_dir: Path | None) -> int:
    live = live_metrics(job, start, end)
    state = trainer_progress(job)
    stream = stream_metrics(state, job, start, end)
    baselines: dict[str, dict[datetime, dict]] = {}
    if eval_dir is not None and (eval_dir / "report.json").exists():
        for row in json.loads((eval_dir / "report.json").read_text())["windows"]:
            when = parse_utc(row.pop("window"), "window")
            for mode, score in row.items():
                baselines.setdefault(mode, {})[when] = score
    columns = [("MTRM live", stream)] + [(f"eval {name}", baselines[name]) for name in sorted(baselines)]
    print("Each hour's stream rows, scored before anything trained on them (progressive):")
    print("  MTRM live = the service-mode trainer under Airflow, reading the stream through the stream executors,")
    print("    against the stream's real-time label (all a live trainer knows then);")
    print("  eval <mode> = `primus eval` over the same hours and data (the same trainer loop, a file-replayed stream),")
    print("    against the complete label: the label differs, so the two kinds of column do not compare.")
    print("history = the live trainer's score of the window's batch rows (complete labels) before training them;")
    print("  by then it has trained that hour's stream rows (the batch lag is 24 h): not comparable to the rest.")
    fmt = lambda v: f"{v:.4f}" if isinstance(v, (int, float)) else "-"  # noqa: E731
    head = f"{'window':<18} {'rows':>5}" + "".join(f"  {name + ' auc':>21} {'logloss':>7}" for name, _ in columns)
    print(head + f"  {'history auc':>11} {'logloss':>7}")
    windows = sorted(set(live) | set(stream))
    for when in windows:
        line = f"{when:%Y-%m-%d %H:%M}  {stream.get(when, {}).get('samples', '-'):>5}"
        for _, scores in columns:
            score = scores.get(when, {})
            line += f"  {fmt(score.get('auc')):>21} {fmt(score.get('logloss')):>7}"
        history = live.get(when, {})
        print(line + f"  {fmt(history.get('auc')):>11} {fmt(history.get('logloss')):>7}")
    if windows:
        print(_means(windows, columns, live))
    if state.get("step") is not None:
        print(f"trainer: step {state.get('step')}, stream position {json.dumps(state.get('stream_position', {}))}")
    return 0 if live else 1


def _means(windows: list[datetime], columns: list[tuple[str, dict]], live: dict) -> str:
    def mean(values: list) -> str:
        values = [v for v in values if isinstance(v, (int, float))]
        return f"{sum(values) / len(values):.4f}" if values else "-"

    line = f"{'mean':<18} {'':>5}"
    for _, scores in columns + [("history", live)]:
        width = 11 if scores is live else 21
        picked = [scores.get(w, {}) for w in windows]
        line += f"  {mean([s.get('auc') for s in picked]):>{width}} {mean([s.get('logloss') for s in picked]):>7}"
    return line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {NAME}", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    reset_p = sub.add_parser("reset", help="remove what an earlier demo left of the job")
    reset_p.add_argument("spec")
    report_p = sub.add_parser("report", help="AUC/logloss per window: the live MTRM trainer and the baselines")
    report_p.add_argument("spec")
    report_p.add_argument("--from", dest="start", required=True)
    report_p.add_argument("--to", dest="end", required=True)
    report_p.add_argument("--eval", type=Path, help="a `primus eval --out` directory (its report.json)")
    args = parser.parse_args(argv)
    job = load_job(args.spec)
    try:
        if args.command == "reset":
            reset(job, args.spec)
            return 0
        return report(job, parse_utc(args.start, "--from"), parse_utc(args.end, "--to"), args.eval)
    except (RuntimeError, AirflowApiError, KeyError) as exc:
        print(f"{NAME}: {args.command} failed: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
