"""``primus validate SPEC...``: check job specs; one line per problem, exit 2 on any."""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("validate", help="check PrimusJob spec files")
    parser.add_argument("specs", nargs="+", metavar="SPEC")
    parser.add_argument(
        "--strict-env",
        action="store_true",
        help="treat unset ${VAR}s as errors (the default warns: they must be set when the job runs)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from primus_lib.spec import SpecError, load_job

    status = 0
    for path in args.specs:
        warnings: list = []
        try:
            job = load_job(path, warnings=None if args.strict_env else warnings)
        except SpecError as exc:
            print(exc, file=sys.stderr)
            status = 2
            continue
        for warning in warnings:
            print(f"warning: {warning.format(path)}", file=sys.stderr)
        print(f"{path}: ok: {summary(job)}")
    return status


def summary(job) -> str:
    spec = job.spec
    timer = spec.timer
    end = timer.end.strftime("%Y-%m-%dT%H:%MZ") if timer.end else "open"
    streams = ", ".join(f"{s.name}({s.kind}, {len(s.sources)} src)" for s in spec.dataset.streams)
    return (
        f"PrimusJob {job.name}: {timer.window} windows {timer.start:%Y-%m-%dT%H:%MZ}..{end}; "
        f"streams {streams}; mode {spec.training.mode}; backend {spec.resources.backend}"
    )
