"""``primus datagen SPEC``: write drifting synthetic CTR logs for a spec's time range."""

from __future__ import annotations

import argparse
import os
import sys
from datetime import UTC, datetime, timedelta

from primus_lib.cli.arguments import integer
from primus_lib.timegrid import EPOCH, iso, on_grid, parse_utc


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("datagen", help="generate synthetic drifting CTR logs (batch partitions + stream)")
    parser.add_argument("spec", metavar="SPEC", help="PrimusJob spec; its timer gives the default range")
    parser.add_argument("--start", help="ISO instant (UTC); default the timer's start")
    parser.add_argument("--end", help="ISO instant (UTC, exclusive); default the timer's end (or start + 2 days)")
    parser.add_argument("--rows-per-hour", type=integer(1), default=3000, help="mean impressions per hour")
    parser.add_argument("--seed", type=integer(0), default=0)
    parser.add_argument("--out", help="output root; default $PRIMUS_DATA")
    parser.add_argument("--world", help="world overrides key=value,... (see docs/datagen.md), e.g. pop_drift=0.5")
    parser.add_argument(
        "--kafka",
        metavar="BOOTSTRAP",
        help="also produce the stream to this Kafka cluster (credentials: the spec's Kafka source's connection_id)",
    )
    parser.add_argument("--topic", help="Kafka topic (default: the spec's stream topic)")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from primus_lib.cli.console import Progress
    from primus_lib.data.datagen import DeliveryError, default_range, generate, iter_hours, world_config
    from primus_lib.settings import spec_environment
    from primus_lib.spec import load_job

    env = dict(spec_environment())  # ${PRIMUS_DATA} is the demo specs' variable: --out binds it
    out = args.out or env.get("PRIMUS_DATA")
    if not out:
        print("primus datagen: give --out or set PRIMUS_DATA", file=sys.stderr)
        return 2
    env.setdefault("PRIMUS_DATA", os.path.abspath(out))  # a spec URI may hold no ".."
    job = load_job(args.spec, env)
    start, end = default_range(job)
    try:
        start = parse_utc(args.start, "--start") if args.start else start
        end = parse_utc(args.end, "--end") if args.end else end
        for flag, given, instant in (("--start", args.start, start), ("--end", args.end, end)):
            if given and not on_grid(instant, timedelta(hours=1), EPOCH):
                raise ValueError(f"{flag} {given}: expected a whole hour (the partitions are hourly)")
        if end <= start:
            raise ValueError(f"--end {iso(end)} is not after --start {iso(start)}")
        config = world_config(args.world)
    except ValueError as exc:
        print(f"primus datagen: {exc}", file=sys.stderr)
        return 2
    kafka = None
    if args.kafka:
        topic, credentials = _spec_kafka(job)
        topic = args.topic or topic
        if not topic:
            print("primus datagen: --kafka needs --topic (the spec has no Kafka stream source)", file=sys.stderr)
            return 2
        kafka = ({**credentials, "bootstrap.servers": args.kafka}, topic)
    progress = Progress("datagen", sum(1 for _ in iter_hours(start, end)), "hour", quiet=args.quiet)

    def on_hour(hour: int, rows: int) -> None:
        progress.advance(f"{iso(datetime.fromtimestamp(hour * 3600, tz=UTC))} {rows} rows")

    try:
        with progress:
            result = generate(
                out,
                start,
                end,
                rows_per_hour=args.rows_per_hour,
                seed=args.seed,
                config=config,
                kafka=kafka,
                on_hour=on_hour,
            )
    except ValueError as exc:
        print(f"primus {exc}", file=sys.stderr)
        return 2
    except DeliveryError as exc:
        print(f"primus {exc}", file=sys.stderr)
        return 1
    print(
        f"wrote {result.hours} hours, {result.impressions} impressions, {result.clicks} clicks "
        f"({result.realtime_clicks} seen by the real-time label"
        + (f", {result.resent_clicks} late ones re-sent on the stream" if config.late_click_events else "")
        + f") under {result.out}; "
        f"stream {result.stream_path}" + (f"; {result.kafka_messages} messages to {kafka[1]}" if kafka else "")
    )
    return 0


def _spec_kafka(job) -> tuple[str | None, dict[str, str]]:
    """The topic of the spec's first Kafka stream source and the librdkafka settings of its
    connection (SASL login, security protocol), resolved as the executors resolve them."""
    from primus_lib.data.sources.kafka import connection_config

    for stream in job.stream_streams:
        for source in stream.sources:
            if source.kafka:
                return source.kafka.topic, connection_config(stream, source)
    return None, {}
