"""``primus eval SPEC``: backtest the training modes on the spec's own sources, as production sees them."""

from __future__ import annotations

import argparse
import os
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("eval", help="backtest training modes with progressive validation")
    parser.add_argument("spec", metavar="SPEC")
    parser.add_argument("--modes", default="mtrm,single_tower,offline,online,offline_then_online")
    parser.add_argument("--seeds", default="0,1,2", help="model seeds (the data is the spec's sources)")
    parser.add_argument("--out", required=True, help="directory for report.json and auc.png")
    parser.add_argument("--data", help="sets PRIMUS_DATA, for specs whose source URIs use ${PRIMUS_DATA}")
    parser.add_argument("--eval-from", help="first scored window (ISO); default timer start + lag + 1 day")
    parser.add_argument(
        "--ablations",
        default="",
        help="extra runs, ';'-separated, e.g. 'mtrm[emb=batch];mtrm[residual=1,lr=0.003]' (see docs/training.md)",
    )
    parser.add_argument("--start", help="first hour (ISO); default the timer's start")
    parser.add_argument("--end", help="end (ISO, exclusive); default the timer's end")
    parser.add_argument(
        "--data-seeds",
        action="store_true",
        help="generate fresh data per seed under OUT/data/seed-N (seed = data seed)",
    )
    parser.add_argument("--rows-per-hour", type=int, default=3000, help="with --data-seeds: impressions per hour")
    parser.add_argument("--world", help="with --data-seeds: datagen world overrides key=value,...")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from primus_lib.spec import load_job
    from primus_lib.train.backtest import BacktestOptions, run_backtest
    from primus_lib.train.eval_sources import EvalInputError

    if args.data:
        os.environ["PRIMUS_DATA"] = args.data
    elif args.data_seeds:
        os.environ.setdefault("PRIMUS_DATA", os.path.join(args.out, "data"))
    job = load_job(args.spec)
    data = args.data or (os.path.join(args.out, "data") if args.data_seeds else None)
    try:
        options = BacktestOptions.from_cli(args, data)
    except ValueError as exc:  # a bad argument
        return _fail(exc)
    try:
        report = run_backtest(job, options)
    except EvalInputError as exc:  # input eval cannot use: one line naming the file or field
        return _fail(exc)
    print(report.table())
    print(f"wrote {options.out}/report.json and {options.out}/auc.png")
    return 0


def _fail(exc: Exception) -> int:
    print(f"primus eval: {' '.join(str(exc).split())}", file=sys.stderr)
    return 2
