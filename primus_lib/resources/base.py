"""The one resource-controller interface: every backend runs a PrimusJob's roles the same way."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from primus_lib.spec.job import PrimusJob

Phase = Literal["Pending", "Running", "Succeeded", "Failed", "Stopped"]


class ResourceError(RuntimeError):
    """A backend could not do what was asked; the message names the job, role and cause."""


@dataclass
class RoleStatus:
    """What one role has now: desired vs running workers, restarts, per-worker resources."""

    name: str
    desired: int
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    restarts: int = 0
    cpu: float = 0.0
    memory: float = 0.0
    started: bool = False
    cluster: str | None = None
    note: str = ""


@dataclass
class JobStatus:
    job: str
    phase: Phase
    roles: dict[str, RoleStatus] = field(default_factory=dict)
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ResourceBackend(ABC):
    """Runs the roles of one job. Implementations: local processes, Kubernetes, YARN.

    ``submit`` is idempotent (reattaches to what runs, never duplicates); ``scale`` changes a role's
    replicas, ``resize`` its per-worker CPU (cores) / memory (bytes); ``stop`` ends everything.
    """

    name: str = "abstract"

    def __init__(self, job: PrimusJob, spec_path: str | None = None) -> None:
        self.job = job
        self.spec_path = spec_path

    @abstractmethod
    def submit(self) -> JobStatus: ...

    @abstractmethod
    def status(self) -> JobStatus: ...

    @abstractmethod
    def scale(self, role: str, replicas: int) -> None: ...

    @abstractmethod
    def resize(self, role: str, cpu: float | None = None, memory: float | None = None) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    def ensure_running(self) -> JobStatus:
        """Reattach to a live job, or submit it; a finished job is reported, not restarted."""
        current = self.status()
        if current.phase in ("Running", "Pending") and any(r.started for r in current.roles.values()):
            return current
        if current.phase in ("Succeeded", "Failed"):
            return current
        return self.submit()

    def role_spec(self, role: str):
        roles = self.job.spec.resources.roles
        if role not in roles:
            raise ResourceError(f"job {self.job.name!r}: no role {role!r} (roles: {', '.join(roles)})")
        return roles[role]

    def check_replicas(self, role: str, replicas: int) -> int:
        spec = self.role_spec(role)
        if replicas < 0:
            raise ResourceError(f"job {self.job.name!r} role {role!r}: replicas must be >= 0, got {replicas}")
        return max(spec.min_count, min(spec.max_count, replicas)) if spec.max_count >= spec.min_count else replicas
