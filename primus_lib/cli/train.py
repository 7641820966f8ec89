"""``primus train SPEC``: the long-running trainer (standalone or under torchrun)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from primus_lib.cli.arguments import duration, integer


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("train", help="run the trainer of a job (batch windows + stream, checkpointed)")
    parser.add_argument("spec", metavar="SPEC")
    parser.add_argument("--until-window", metavar="WINDOW_ID", help="stop after this batch window (YYYYMMDDTHHMMSSZ)")
    parser.add_argument("--max-steps", type=integer(1), help="stop after this many training steps in total")
    parser.add_argument("--mode", help="override spec.training.mode (see primus_lib/train/model/modes.py)")
    parser.add_argument(
        "--poll-interval", type=duration(zero=False), default=2.0, help="seconds between looks for new windows"
    )
    parser.add_argument(
        "--checkpoint-steps", type=integer(1), help="also checkpoint every N steps (default: per window)"
    )
    parser.add_argument(
        "--idle-exit",
        type=duration(zero=True),
        help="exit when no new data arrived for this many seconds (default: wait forever)",
    )
    parser.add_argument(
        "--switch-at",
        metavar="ISO",
        help="offline_then_online: first stream instant (default: timer start + lag + 1 day)",
    )
    parser.add_argument(
        "--sample-log",
        metavar="PATH",
        type=Path,
        help="append the sample ids of each step to PATH (PATH.rank<r> per rank), for exactly-once checks",
    )
    parser.add_argument(
        "--step-delay",
        type=duration(zero=True),
        default=0.0,
        metavar="S",
        help="sleep S seconds after each step (fault tests)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from primus_lib.paths import parse_window_id
    from primus_lib.spec import load_job
    from primus_lib.timegrid import parse_utc
    from primus_lib.train.model.modes import MODES
    from primus_lib.train.runtime.trainer import TrainerOptions, run_trainer

    job = load_job(args.spec)
    try:
        switch_at = parse_utc(args.switch_at, "--switch-at") if args.switch_at else None
    except ValueError as exc:
        print(f"primus train: {exc}", file=sys.stderr)
        return 2
    if args.until_window:
        try:
            parse_window_id(args.until_window)
        except ValueError:
            print(
                f"primus train: --until-window: expected a window id like 20261101T000000Z, got {args.until_window!r}",
                file=sys.stderr,
            )
            return 2
    if args.mode and args.mode not in MODES:
        print(f"primus train: --mode {args.mode!r}: expected {'|'.join(MODES)}", file=sys.stderr)
        return 2
    options = TrainerOptions(
        until_window=args.until_window,
        max_steps=args.max_steps,
        mode=args.mode,
        poll_interval=args.poll_interval,
        checkpoint_steps=args.checkpoint_steps,
        idle_exit=args.idle_exit,
        switch_at=switch_at,
        sample_log=args.sample_log,
        step_delay=args.step_delay,
    )
    # a long-running process: what it resumed from, why it waits or exits (Primus's own INFO lines;
    # the libraries' stay at WARNING)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("primus", "primus_lib"):  # named loggers ("primus.trainer") and module ones
        logging.getLogger(name).setLevel(logging.INFO)
    summary = run_trainer(job, options)
    print(summary)
    return 0
