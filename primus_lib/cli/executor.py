"""``primus executor SPEC --role stream_executor --index I``: a stream data executor service.

Reads its share of each stream's Kafka partitions, decodes and serves the samples over Arrow
Flight until SIGTERM (``primus_lib.data.executor.service``). Index and replica count default to
what the resource backends set (``$PRIMUS_REPLICA_INDEX``, ``$PRIMUS_REPLICAS``), then to the
role's ``replicas`` in the spec. Every Flight call must carry the job's token, which the executor
reads (or first makes) where its discovery says (``primus_lib.data.flight_auth``): never an argument.
"""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import sys
import threading

from primus_lib.cli.arguments import duration, integer, refuse_choice


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("executor", help="serve a stream's samples to the trainer (Kafka -> Arrow Flight)")
    parser.add_argument("spec", metavar="SPEC")
    parser.add_argument("--role", help="the role to run (default $PRIMUS_ROLE, else stream_executor)")
    parser.add_argument("--index", type=integer(0), help="this executor's index (default $PRIMUS_REPLICA_INDEX or 0)")
    parser.add_argument(
        "--replicas", type=integer(1), help="executors of the stream (default $PRIMUS_REPLICAS, the spec)"
    )
    parser.add_argument("--stream", help="the stream to serve (default: every stream of kind stream)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 on a cluster)")
    parser.add_argument("--port", type=integer(0, 65535), default=0, help="Flight port (default: any free one)")
    parser.add_argument("--advertise", help="host name the trainer connects to (default: --host)")
    parser.add_argument(
        "--buffer-rows", type=integer(1), default=65536, help="bounded buffer; Kafka is not polled while full"
    )
    parser.add_argument("--poll-rows", type=integer(1), default=4096, help="messages per Kafka poll")
    lease = "seconds: rows a reader took but did not acknowledge within this are served again (default 30)"
    parser.add_argument("--lease-seconds", type=duration(zero=False), help=lease)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from primus_lib.data.executor.leases import LEASE_SECONDS
    from primus_lib.data.executor.service import ExecutorService
    from primus_lib.resources.discovery import discovery_for
    from primus_lib.settings import settings
    from primus_lib.spec import load_job

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    deployed = settings()  # what the resource backend set: role, replica index, replicas
    args.role = args.role or deployed.role or "stream_executor"
    if args.role != "stream_executor":
        print(f"primus executor: role {args.role!r}: only stream_executor runs as a service", file=sys.stderr)
        return 2
    job = load_job(args.spec)
    index = args.index if args.index is not None else (deployed.replica_index or 0)
    role = job.spec.resources.roles.get(args.role)
    replicas = args.replicas or deployed.replicas or (role.replicas if role else 1) or 1
    names = [s.name for s in job.stream_streams]
    if not names:
        print(f"primus executor: job {job.name!r} has no stream of kind stream", file=sys.stderr)
        return 2
    if args.stream is not None and args.stream not in names:
        expected = f"a stream of kind stream of job {job.name!r}"
        return refuse_choice("executor", "--stream", expected, names, args.stream)
    streams = [args.stream] if args.stream else names
    if args.port and len(streams) > 1:
        print("primus executor: --port with several streams: give --stream", file=sys.stderr)
        return 2
    from confluent_kafka import KafkaException

    from primus_lib.credentials import LoginRefused

    services = []
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        for name in streams:
            try:
                service = ExecutorService(
                    job,
                    name,
                    index,
                    replicas,
                    host=args.host,
                    port=args.port,
                    advertise=args.advertise,
                    capacity_rows=args.buffer_rows,
                    poll_rows=args.poll_rows,
                    discovery=discovery_for(job, name),
                    lease=args.lease_seconds or LEASE_SECONDS,
                )
            except KafkaException as exc:  # a refused login, or no answer within the retries (a minute)
                error = exc.args[0]
                why = error.str() if hasattr(error, "str") else str(error)
                what = "" if isinstance(exc, LoginRefused) else "Kafka did not answer: "
                print(f"primus executor: stream {name!r}: {what}{why}", file=sys.stderr)
                return 1
            services.append(service.start())
            service.report()
            print(
                f"executor {name}/{index} of {replicas} serving {service.location} partitions {service.keys}",
                flush=True,
            )
        # What the start-up made lives as long as the process (the imports, the spec, the consumers and
        # the Flight server): frozen, the collector's passes stop walking it. Each block of Kafka messages
        # is thousands of tracked objects, so passes come often: in bench/stream.py (1,000,000 rows over 1, 2
        # or 4 executors) they took 0.27-0.41 s of each executor's 1.3-2.9 s of CPU, frozen 0.03-0.07 s.
        gc.freeze()
        stop.wait()
    finally:
        for service in services:
            service.stop()
    return 0
