"""``primus resources ACTION SPEC``: run a job's roles through its resource backend from the shell
(start = idempotent ensure_running, status, scale, resize, stop, rebalance across clusters, and
one Dynamic Scaling Manager step)."""

from __future__ import annotations

import argparse
import json
import sys

from primus_lib.cli.arguments import integer, refuse_choice

ACTIONS = ("start", "status", "scale", "resize", "stop", "rebalance", "autoscale")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("resources", help="start/inspect/scale/stop a job's roles (resource backend)")
    parser.add_argument("action", choices=ACTIONS)
    parser.add_argument("spec", help="PrimusJob spec file")
    parser.add_argument("--role", help="role to scale or resize")
    parser.add_argument("--replicas", type=integer(0), help="scale: the new replica count")
    parser.add_argument("--cpu", help="resize: cores per worker (2, 500m)")
    parser.add_argument("--memory", help="resize: memory per worker (4Gi)")
    parser.add_argument("--prometheus", help="autoscale: Prometheus URL (default: the job's metrics snapshots)")
    parser.add_argument(
        "--prometheus-conn-id",
        metavar="ID",
        help="autoscale: an HTTP connection with Prometheus's login (and its URL when --prometheus is not given)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from primus_lib.resources import backend_for
    from primus_lib.spec import load_job
    from primus_lib.spec.units import parse_quantity

    job = load_job(args.spec)
    roles = job.spec.resources.roles
    if args.action in ("scale", "resize") and not args.role:
        print(f"primus resources {args.action}: --role is required", file=sys.stderr)
        return 2
    if args.role is not None and args.role not in roles:
        return refuse_choice(
            f"resources {args.action}", "--role", f"a role of job {job.name!r}", sorted(roles), args.role
        )
    backend = backend_for(job, args.spec)
    if args.action == "start":
        print(json.dumps(backend.ensure_running().to_dict(), indent=1))
    elif args.action == "status":
        print(json.dumps(backend.status().to_dict(), indent=1))
    elif args.action == "scale":
        if args.replicas is None:
            print("primus resources scale: --replicas is required", file=sys.stderr)
            return 2
        backend.scale(args.role, args.replicas)
    elif args.action == "resize":
        cpu = parse_quantity(args.cpu) if args.cpu else None
        memory = parse_quantity(args.memory) if args.memory else None
        backend.resize(args.role, cpu=cpu, memory=memory)
    elif args.action == "stop":
        backend.stop()
    elif args.action == "rebalance":
        if not hasattr(backend, "rebalance"):
            raise SystemExit("primus resources rebalance: the spec names no spec.resources.clusters")
        print(json.dumps(backend.rebalance(), indent=1))
    else:
        from primus_lib.metrics.readers import PrometheusError
        from primus_lib.scaling.step import scaling_step

        try:
            prometheus = _prometheus(args)
        except ValueError as exc:  # the connection is missing or unusable (CredentialsError), or has no host
            print(f"primus resources autoscale: {exc}", file=sys.stderr)
            return 2
        try:
            decisions = scaling_step(job, prometheus=prometheus, backend=backend)
        except PrometheusError as exc:
            print(f"primus resources autoscale: {exc}", file=sys.stderr)
            return 1
        print(json.dumps([d.to_dict() for d in decisions], indent=1, default=str))
    return 0


def _prometheus(args: argparse.Namespace):
    """--prometheus, with the login of --prometheus-conn-id (whose host is the URL without --prometheus)."""
    from primus_lib.credentials import current
    from primus_lib.metrics.readers import PrometheusEndpoint

    if not args.prometheus_conn_id:
        return args.prometheus
    where = f"--prometheus-conn-id {args.prometheus_conn_id!r}"
    return PrometheusEndpoint.of(args.prometheus, current().http(args.prometheus_conn_id, where), where)
