"""``primus backfill SPEC --from A --to B``: (re)train a range of windows through Airflow, in time order.

Wraps Airflow 3's backfill (``POST /api/v2/backfills`` when ``--api`` is given, else the local
``airflow backfill create`` CLI). Windows whose start lies in ``[--from, --to)`` become DAG
runs of the job's DAG (dag id = job name), run oldest first; the Sink's ``depends_on_past``
keeps their commits in order. Re-running a finished window is idempotent (the data plane's
commits are), so ``--reprocess completed`` is safe. ``--dry-run`` lists the windows only.
``--wait`` prints one line per window as its run finishes (stderr) and a summary (stdout).
This module does not import Airflow (``primus_lib`` never does): it talks HTTP
(``primus_lib.airflow_api``) or runs the CLI.

The API password never travels in argv, where ``ps`` shows it to every user of the host: it comes
from ``--password-file``, else ``$PRIMUS_AIRFLOW_PASSWORD``, else the Airflow connection
``--conn-id`` (``$AIRFLOW_CONN_PRIMUS_AIRFLOW_API``, the one the scaler and the trainer task use).
``--password`` is refused (exit 2) with a line saying so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

from primus_lib.airflow_api import FINAL_STATES, AirflowApi, AirflowApiError
from primus_lib.cli.arguments import duration, integer
from primus_lib.cli.console import Progress, seconds
from primus_lib.credentials import Resolver, current
from primus_lib.naming import API_CONNECTION, MODE_PARAM, pool_name
from primus_lib.settings import settings
from primus_lib.timegrid import iso, parse_utc


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("backfill", help="run a range of training windows through Airflow, in order")
    parser.add_argument("spec", metavar="SPEC")
    parser.add_argument("--from", dest="start", required=True, help="ISO instant (UTC): first window start")
    parser.add_argument("--to", dest="end", required=True, help="ISO instant (UTC, exclusive): windows start before it")
    parser.add_argument("--dry-run", action="store_true", help="print the windows and the request, change nothing")
    parser.add_argument(
        "--reprocess",
        choices=["none", "completed", "failed"],
        default="failed",
        help="windows that already have a run: redo failed ones (default), redo all (completed; "
        "idempotent), or none (Airflow refuses none for our depends_on_past Sink)",
    )
    parser.add_argument(
        "--max-active-runs",
        type=integer(1),
        default=3,
        help="windows in flight at once (default 3; keep >= 2: the trainer finishes window N's "
        "last partial minibatch with window N+1's rows)",
    )
    parser.add_argument("--mode", choices=["service", "inline", "skip"], help="trainer mode for these runs (DAG param)")
    parser.add_argument(
        "--api", default=None, help="Airflow API server URL (default $PRIMUS_AIRFLOW_API; none: the local airflow CLI)"
    )
    parser.add_argument("--user", help="API user (default the connection's login, else admin)")
    secret = "file whose first line is the API password (default the connection's)"
    parser.add_argument("--password-file", metavar="PATH", help=secret)
    conn = f"connection with the API login and password: $PRIMUS_SECRETS_DIR/<ID>.json (default {API_CONNECTION})"
    parser.add_argument("--conn-id", default=API_CONNECTION, help=conn)
    parser.add_argument("--password", nargs="?", action=RefusedInArgv, help=argparse.SUPPRESS)
    parser.add_argument("--keep-paused", action="store_true", help="do not unpause the DAG (backfill runs wait then)")
    parser.add_argument("--wait", action="store_true", help="(API) wait until every run finished; exit 1 if one failed")
    parser.add_argument("--timeout", type=duration(zero=False), default=3600.0, help="seconds --wait waits")
    parser.add_argument("--quiet", "-q", action="store_true", help="with --wait: no per-window progress on stderr")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from primus_lib.data.dtgg.timer import windows
    from primus_lib.spec import load_job

    job = load_job(args.spec)
    try:
        start, end = parse_utc(args.start, "--from"), parse_utc(args.end, "--to")
    except ValueError as exc:
        print(f"primus backfill: {exc}", file=sys.stderr)
        return 2
    if end <= start:
        print(f"primus backfill: --to {iso(end)} must be after --from {iso(start)}", file=sys.stderr)
        return 2
    planned = list(windows(job, start, end))
    if not planned:
        print(f"primus backfill: no window of job {job.name} starts in [{iso(start)}, {iso(end)})", file=sys.stderr)
        return 2
    body = {
        "dag_id": job.name,
        "from_date": iso(planned[0]),
        "to_date": iso(planned[-1]),  # Airflow's to_date is inclusive (a window start)
        "run_backwards": False,
        "reprocess_behavior": args.reprocess,
        "max_active_runs": args.max_active_runs,
        "dag_run_conf": {MODE_PARAM: args.mode} if args.mode else None,
    }
    print(f"job {job.name}: {len(planned)} windows {iso(planned[0])} .. {iso(planned[-1])} ({job.spec.timer.window})")
    if args.dry_run:
        for when in planned:
            print(f"  window {iso(when)}")
        print("request: " + json.dumps(body, sort_keys=True))
        return 0
    args.api = args.api or settings().airflow_api
    if args.api:
        where = urlsplit(args.api)
        if where.scheme not in ("http", "https") or not where.hostname:
            print(
                f"primus backfill: --api: expected an http(s) URL like http://host:8080, got {args.api!r}",
                file=sys.stderr,
            )
            return 2
        role = job.spec.resources.roles.get("data_executor")
        return _via_api(args, body, planned, max(1, role.replicas) if role else 1)
    return _via_cli(args, body)


def _via_cli(args: argparse.Namespace, body: dict) -> int:
    airflow = shutil.which("airflow") or os.path.join(os.path.dirname(sys.executable), "airflow")
    if not args.keep_paused:
        subprocess.run([airflow, "dags", "unpause", body["dag_id"]], check=False)
    command = [
        airflow,
        "backfill",
        "create",
        "--dag-id",
        body["dag_id"],
        "--from-date",
        body["from_date"],
        "--to-date",
        body["to_date"],
        "--reprocess-behavior",
        body["reprocess_behavior"],
        "--max-active-runs",
        str(body["max_active_runs"]),
    ]
    if body["dag_run_conf"]:
        command += ["--dag-run-conf", json.dumps(body["dag_run_conf"])]
    print("running: " + " ".join(command))
    return subprocess.run(command, check=False).returncode


class RefusedInArgv(argparse.Action):
    """``--password``: refused before anything runs, naming the ways that keep it out of ``ps``."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        how = "--password-file PATH or the connection of --conn-id ($PRIMUS_SECRETS_DIR/<ID>.json)"
        parser.exit(
            2, f"primus backfill: {option_string} is refused (argv shows in `ps`): pass the password with {how}\n"
        )


def credentials(args: argparse.Namespace, resolver: Resolver | None = None) -> tuple[str, str | None]:
    """(user, password) of the API calls: ``--user`` / ``--password-file``, else the connection
    ``--conn-id`` (``primus_lib.credentials``: the secret file ``$PRIMUS_SECRETS_DIR/<ID>.json``);
    ValueError (one line) for an unusable file or connection."""
    login, conn_password = (resolver or current()).login(args.conn_id, "--conn-id")
    user = args.user or login or "admin"
    if not args.password_file:
        return user, conn_password
    where = f"--password-file {args.password_file}"
    try:
        text = Path(args.password_file).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{where}: cannot read it: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{where}: not UTF-8 text (expected the password on its first line)") from None
    password = text.split("\n", 1)[0].rstrip("\r")
    if not password:
        raise ValueError(f"{where}: its first line is empty (expected the password)")
    return user, password


def _via_api(args: argparse.Namespace, body: dict, planned: list[datetime], pool_slots: int) -> int:
    try:
        user, password = credentials(args)
    except ValueError as exc:
        print(f"primus backfill: {exc}", file=sys.stderr)
        return 2
    api = AirflowApi(args.api, user, password)
    try:
        if not args.keep_paused:
            api.set_paused(body["dag_id"], False)
        api.ensure_pool(pool_name(body["dag_id"]), pool_slots)
        backfill = api.create_backfill(body, on_settle=lambda done: print(_settling(done), flush=True))
    except AirflowApiError as exc:  # unreachable, or a request refused: no backfill was created
        print(f"primus backfill: {exc}", file=sys.stderr)
        return 1
    print(f"backfill {backfill['id']} created for {body['dag_id']}", flush=True)
    if not args.wait:
        return 0
    with Progress("backfill", len(planned), "window", quiet=args.quiet) as progress:
        lines = WindowLines(progress, planned[0], planned[-1])
        try:
            api.wait_backfill(backfill["id"], body["dag_id"], planned, args.timeout, on_poll=lines)
        except AirflowApiError as exc:  # timed out, or the API went away: say what finished so far
            progress.close()
            print(lines.summary(backfill["id"], body["dag_id"]), flush=True)
            print(f"primus backfill: {exc}", file=sys.stderr)
            return 1
    print(lines.summary(backfill["id"], body["dag_id"]))
    return 1 if lines.failed() else 0


def _settling(done: dict) -> str:
    return (
        f"backfill {done['id']} of {done['dag_id']}: every run finished; Airflow marks it complete within 30 s "
        "and runs one backfill of a DAG at a time: waiting for it"
    )


class WindowLines:
    """``--wait``'s progress, fed with the backfill's runs after every poll: one line per window of
    ``[first, last]`` when its run reaches a final state (window, state, duration), then a summary."""

    def __init__(self, progress: Progress, first: datetime, last: datetime) -> None:
        self.progress, self.first, self.last = progress, first, last
        self.finished: dict[datetime, dict] = {}  # window start -> its finished run

    def __call__(self, runs: list[dict]) -> None:
        for run in sorted(runs, key=lambda r: r.get("logical_date") or ""):
            when = parse_utc(run["logical_date"], "logical_date") if run.get("logical_date") else None
            if when is None or not self.first <= when <= self.last or run.get("state") not in FINAL_STATES:
                continue
            seen = when in self.finished
            self.finished[when] = run  # a later final state (a window run again) counts in the summary
            if seen:
                continue
            self.progress.advance(f"window {iso(when)} {run['state']} {seconds(run_seconds(run))}", keep=True)

    def failed(self) -> list[datetime]:
        return [when for when, run in sorted(self.finished.items()) if run["state"] != "success"]

    def summary(self, backfill_id: object, dag_id: str) -> str:
        ok = sum(run["state"] == "success" for run in self.finished.values())
        total = self.progress.total
        line = (
            f"backfill {backfill_id} of {dag_id}: {len(self.finished)}/{total} windows finished, "
            f"{ok} success, {len(self.failed())} failed, in {seconds(self.progress.elapsed())}"
        )
        if self.failed():
            line += "; failed: " + ", ".join(iso(when) for when in self.failed())
        return line


def run_seconds(run: dict) -> float | None:
    """A DAG run's duration: its ``duration`` field, else end minus start (None if not known)."""
    if run.get("duration") is not None:
        return float(run["duration"])
    if run.get("start_date") and run.get("end_date"):
        return (parse_utc(run["end_date"]) - parse_utc(run["start_date"])).total_seconds()
    return None
