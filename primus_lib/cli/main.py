"""Entry point of the ``primus`` console script."""

from __future__ import annotations

import argparse
import importlib
import sys

from primus_lib import __version__
from primus_lib.commands import SUBCOMMANDS
from primus_lib.credentials import LoginRefused
from primus_lib.resources.base import ResourceError
from primus_lib.spec.errors import SpecError
from primus_lib.train.checkpoint.safe_load import UnsafeCheckpointError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="primus", description="Unified DLRM training on Airflow.")
    parser.add_argument("--version", action="version", version=f"primus {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS:  # primus_lib.commands: the backends read the list too
        importlib.import_module(f"primus_lib.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 2
    except UnsafeCheckpointError as exc:  # shared storage holding code: refused, nothing of it ran
        print(f"primus {args.command}: {exc}", file=sys.stderr)
        return 1
    except ResourceError as exc:  # a backend could not do it: the message names the job, role and cause
        print(f"primus {args.command}: {exc}", file=sys.stderr)
        return 1
    except LoginRefused as exc:  # a connection's login, refused by its server: the message names both
        print(f"primus {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
