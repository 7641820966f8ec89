"""The ``primus`` subcommands and the roles that run one by default.

Named here, below both users: ``primus_lib.cli.main`` registers the subcommands (one module each
under ``primus_lib.cli``), and the resource backends start a role without ``command`` as
``python -m primus_lib.cli.main <subcommand> SPEC``. A role whose subcommand is not listed has
no runnable default, and no backend starts it (batch data executors are Airflow's mapped tasks).
"""

from __future__ import annotations

# One module under primus_lib.cli per subcommand, in the order ``primus --help`` lists them.
SUBCOMMANDS: tuple[str, ...] = (
    "validate",
    "crd",
    "datagen",
    "train",
    "eval",
    "backfill",
    "plan",
    "resources",
    "executor",
)

# The subcommand a role runs when its RoleSpec.command is empty.
# Batch data executors are the DAG's mapped tasks: no process of theirs is started by a backend.
ROLE_SUBCOMMANDS: dict[str, str] = {"trainer": "train", "stream_executor": "executor"}


def role_subcommand(role: str) -> str | None:
    """The subcommand ``role`` runs by default, or None when it has none that exists."""
    sub = ROLE_SUBCOMMANDS.get(role)
    return sub if sub in SUBCOMMANDS else None
