"""``primus crd``: print the PrimusJob CustomResourceDefinition as YAML."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("crd", help="print the PrimusJob CustomResourceDefinition")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from primus_lib.spec.crd import crd_yaml

    print(crd_yaml(), end="")
    return 0
