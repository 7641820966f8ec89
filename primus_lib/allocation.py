"""The CPU and memory each role's workers get now: the vertical policy's latest decision, else the spec.

``<job>/scaling/resources.json`` maps a role to ``{"cpu": cores, "memory": bytes}``. The scaler
(``primus_lib.scaling``) writes it; whoever sizes or measures a worker reads it: the DAG's
``executor_config`` for the mapped data-executor tasks, and those tasks' metrics (usage against
the allocation). A module of its own so that the readers need not import the scaler.
"""

from __future__ import annotations

import json
from pathlib import Path

from primus_lib.paths import JobPaths
from primus_lib.spec.job import PrimusJob
from primus_lib.storage import StorageLocation, Where, locate

RESOURCES_FILE = "resources.json"


def scaling_dir(job: PrimusJob) -> Path:
    """The job's scaling state (``primus_lib.scaling.store``), resources.json included."""
    return JobPaths.for_job(job).root / "scaling"


def allocations_dir(job: PrimusJob) -> StorageLocation:
    """Where resources.json lives: with the job's shared state (``spec.storage.root``, possibly
    s3:// or webhdfs://), so a pod-creating scheduler or a task on another host reads the scaler's
    decision; for a local root the same directory as ``scaling_dir``."""
    return JobPaths.for_job(job).state / "scaling"


def read_allocations(directory: Where) -> dict[str, dict[str, float]]:
    """Every role recorded in ``directory``'s resources.json (empty before the first decision)."""
    path = locate(directory) / RESOURCES_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc


def record_allocation(directory: Where, role: str, cpu: float, memory: float) -> None:
    """Set one role's per-worker allocation (cores, bytes), keeping the others; atomic."""
    current = read_allocations(directory)
    current[role] = {"cpu": cpu, "memory": memory}
    (locate(directory) / RESOURCES_FILE).put_atomic(json.dumps(current, indent=1, sort_keys=True).encode("utf-8"))


def role_resources(job: PrimusJob, role: str) -> tuple[float, float]:
    """The role's per-worker (cpu cores, memory bytes): the latest vertical decision, else the spec."""
    decided = read_allocations(allocations_dir(job)).get(role)
    if decided:
        return float(decided["cpu"]), float(decided["memory"])
    spec = job.spec.resources.roles[role]
    return spec.cpu, spec.memory
