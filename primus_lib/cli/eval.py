"""``primus eval SPEC``: backtest the training modes on the spec's own sources, as production sees them."""

from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime

from primus_lib.cli.arguments import integer
from primus_lib.cli.console import Progress
from primus_lib.timegrid import iso


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
        help="generate fresh data per seed under OUT/data/seed-N (seed = data seed), removed after the report",
    )
    parser.add_argument(
        "--keep-data",
        action="store_true",
        help="with --data-seeds: keep OUT/data (another run on the same OUT reuses it instead of generating)",
    )
    parser.add_argument(
        "--rows-per-hour", type=integer(1), default=3000, help="with --data-seeds: impressions per hour"
    )
    parser.add_argument("--world", help="with --data-seeds: datagen world overrides key=value,...")
    parser.add_argument(
        "--model-seed-offset",
        type=int,
        default=0,
        metavar="N",
        help="the model's seed is the seed plus N (with --data-seeds: another start on the same data)",
    )
    parser.add_argument(
        "--capacity",
        type=integer(1),
        metavar="ROWS",
        help="the trainer trains at most ROWS rows per hour of data (default: all that arrived): "
        "the rest waits in its buffer, where the priority rule orders it",
    )
    parser.add_argument("--threads", type=integer(1), default=1, help="torch threads per run")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr (results still on stdout)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from primus_lib.settings import spec_environment
    from primus_lib.spec import load_job

    env = dict(spec_environment())
    if args.data:  # absolute: a spec's URIs may hold no '..' (docs/reliability.md)
        env["PRIMUS_DATA"] = os.path.abspath(args.data)
    elif args.data_seeds:
        env.setdefault("PRIMUS_DATA", os.path.abspath(os.path.join(args.out, "data")))
    job = load_job(args.spec, env)  # before torch is imported: a bad spec answers at once
    from primus_lib.evaluation.backtest import BacktestOptions, run_backtest
    from primus_lib.evaluation.sources import EvalInputError

    data = args.data or (os.path.join(args.out, "data") if args.data_seeds else None)
    try:
        options = BacktestOptions.from_cli(args, data)
    except ValueError as exc:  # a bad argument
        return _fail(exc)
    try:
        with EvalProgress(len(options.runs) * len(options.seeds), quiet=args.quiet) as observer:
            report = run_backtest(job, options, observer)
    except EvalInputError as exc:  # input eval cannot use: one line naming the file or field
        return _fail(exc)
    print(report.table())
    print(f"wrote {options.out}/report.json and {options.out}/auc.png")
    return 0


class EvalProgress(Progress):
    """One step per (mode, seed, hour): the bar, or one line per scored window; each run's
    summary goes to stdout."""

    def __init__(self, runs: int, *, quiet: bool = False, **kwargs) -> None:
        super().__init__("eval", None, "window", quiet=quiet, **kwargs)
        self.runs = runs

    def phase(self, line: str) -> None:
        self.status(line)

    def planned(self, hours: int) -> None:
        if self.total is None:
            self.set_total(self.runs * hours)

    def hour(self, run: str, seed: int, hour: datetime, score: dict | None) -> None:
        if self._bar is not None and self.done == 0:
            self._bar.set_description_str(self.label)  # the data is loaded
        if score is None:  # a warm-up hour (before --eval-from): counted, no line
            self.skip()
            return
        auc = "n/a" if score["auc"] is None else f"{score['auc']:.4f}"  # an hour without clicks has none
        self.advance(
            f"{run} seed {seed} window {iso(hour)} auc {auc} "
            f"logloss {score['logloss']:.4f} ({score['samples']} samples)"
        )

    def finished(self, line: str) -> None:
        self.note(line, file=sys.stdout)


def _fail(exc: Exception) -> int:
    print(f"primus eval: {' '.join(str(exc).split())}", file=sys.stderr)
    return 2
