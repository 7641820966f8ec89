"""Role semantics shared by every backend: start order, default commands, kinds, success policy."""

from __future__ import annotations

import sys
from graphlib import CycleError, TopologicalSorter

from primus_lib.commands import role_subcommand
from primus_lib.resources.base import ResourceError
from primus_lib.spec.job import PrimusJob

# The job succeeds when every worker of these roles has exited 0; the other roles are then stopped.
SUCCESS_ROLES = ("trainer",)
# Roles that only make sense as long-running services (stream executors, parameter servers) are
# StatefulSets on Kubernetes; the trainer is a (Indexed) Job or a PyTorchJob.
TRAINER_ROLE = "trainer"


def start_order(job: PrimusJob) -> list[list[str]]:
    """Roles grouped in waves: a wave starts when every role of the previous waves runs."""
    roles = job.spec.resources.roles
    sorter = TopologicalSorter({name: set(spec.start_after) for name, spec in roles.items()})
    try:
        sorter.prepare()
    except CycleError as exc:
        raise ResourceError(f"job {job.name!r}: spec.resources.roles start_after has a cycle: {exc.args[1]}") from exc
    waves: list[list[str]] = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready())
        waves.append(ready)
        sorter.done(*ready)
    return waves


def is_critical(job: PrimusJob, role: str) -> bool:
    """A critical role failing for good fails the job; the trainer is always critical."""
    return role == TRAINER_ROLE or job.spec.resources.roles[role].critical


def default_command(role: str, spec_path: str | None) -> list[str] | None:
    """The command a role runs when RoleSpec.command is None: its ``primus`` subcommand
    (``primus_lib.commands``) on the spec, or None when there is no runnable default."""
    sub = role_subcommand(role)
    if sub is None or spec_path is None:
        return None
    return [sys.executable, "-m", "primus_lib.cli.main", sub, spec_path]


def command_for(job: PrimusJob, role: str, spec_path: str | None) -> list[str] | None:
    spec = job.spec.resources.roles[role]
    if spec.command:
        return [str(part).replace("{SPEC}", spec_path or "") for part in spec.command]
    return default_command(role, spec_path)
