"""primus_lib.commands: the CLI registers exactly these subcommands; roles run one only if it exists."""

from __future__ import annotations

import sys

from primus_lib.cli.main import build_parser
from primus_lib.commands import SUBCOMMANDS, role_subcommand
from primus_lib.resources.roles import default_command


def test_the_cli_registers_every_listed_subcommand():
    choices = build_parser()._subparsers._group_actions[0].choices
    assert list(choices) == list(SUBCOMMANDS)


def test_a_role_runs_its_subcommand_only_when_it_exists():
    assert role_subcommand("trainer") == "train"
    assert default_command("trainer", "job.yaml") == [sys.executable, "-m", "primus_lib.cli.main", "train", "job.yaml"]
    assert default_command("trainer", None) is None
    assert role_subcommand("parameter_server") is None
    if "executor" not in SUBCOMMANDS:  # until `primus executor` exists, no backend starts executors
        assert default_command("stream_executor", "job.yaml") is None
