"""``primus plan SPEC --start T --end T [--json]``: plan a batch stream's windows with DTGG and print them.

Planned windows are recorded in the job's ledger (the data task queue) unless ``--dry-run``;
a window already there is served from it. Exit 3 when planning stopped at a window whose
partitions are missing or incomplete.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from primus_lib.cli.arguments import integer, refuse_choice


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("plan", help="plan a batch stream's data tasks (DTGG) and print them")
    parser.add_argument("spec", metavar="SPEC")
    parser.add_argument("--start", help="first window (ISO-8601, default: timer.start)")
    parser.add_argument("--end", help="end instant, exclusive (default: timer.end; required if open-ended)")
    parser.add_argument("--stream", help="batch stream name (default: the first batch stream)")
    parser.add_argument("--threads", type=integer(1), default=None, help="listing threads (default 16)")
    parser.add_argument("--dry-run", action="store_true", help="do not record the plan in the job's ledger")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from primus_lib.data.dtgg import Planner
    from primus_lib.spec import load_job

    job = load_job(args.spec)
    start, end = _instant(args.start, "--start"), _instant(args.end, "--end")
    if end is None and job.spec.timer.end is None:
        print("primus plan: --end is required for an open-ended timer", file=sys.stderr)
        return 2
    streams = job.batch_streams
    if not streams:
        print(f"primus plan: job {job.name!r} has no batch stream", file=sys.stderr)
        return 2
    names = [s.name for s in streams]
    if args.stream is not None and args.stream not in names:
        return refuse_choice("plan", "--stream", f"a batch stream of job {job.name!r}", names, args.stream)
    stream = args.stream or names[0]
    planner = Planner(job, stream, threads=args.threads, ledger=not args.dry_run)
    began = time.perf_counter()
    windows, missing, tasks = [], [], 0
    for plan in planner.plan(start, end, strict=False):
        if not plan.ready:
            missing = plan.missing
            break
        sources = {s.name: len(plan.by_source(s.name)) for s in job.stream(stream).sources}
        tasks += len(plan.tasks)
        windows.append(
            {
                "window": plan.window,
                "start": plan.start.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "tasks": len(plan.tasks),
                "by_source": sources,
                "cached": plan.cached,
            }
        )
        if not args.json:
            detail = ", ".join(f"{k} {v}" for k, v in sources.items())
            print(f"{plan.window} {stream}: {len(plan.tasks)} tasks ({detail}){' [cached]' if plan.cached else ''}")
    seconds = time.perf_counter() - began
    report = {
        "job": job.name,
        "stream": stream,
        "windows": windows,
        "complete": not missing,
        "missing": missing,
        "tasks": tasks,
        "listings": planner.listings,
        "seconds": round(seconds, 3),
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{len(windows)} windows, {tasks} tasks, {planner.listings} listings, {seconds:.2f}s")
        for line in missing:
            print(f"waiting: {line}")
    return 0 if not missing else 3


def _instant(text: str | None, flag: str):
    if text is None:
        return None
    from primus_lib.timegrid import parse_utc

    try:
        return parse_utc(text, flag)
    except ValueError as exc:  # a bad argument: exit 2, as argparse's own errors
        print(f"primus plan: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
