"""Roles of a job and where they run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from primus_lib.spec.base import SpecModel
from primus_lib.spec.types import Quantity

Backend = Literal["local", "kubernetes", "yarn"]


class RoleSpec(SpecModel):
    replicas: int = Field(1, ge=0)
    min_replicas: int | None = Field(None, ge=0)
    max_replicas: int | None = Field(None, ge=0)
    cpu: Quantity = 1.0
    memory: Quantity = 2 * 2**30
    gpu: int = Field(0, ge=0)
    image: str | None = None
    command: list[str] | None = None
    start_after: list[str] = Field(default_factory=list, description="Roles that must be running first.")
    max_restarts: int = Field(3, ge=0, description="Restarts of a failed worker before giving up.")
    critical: bool = Field(False, description="The job fails when this role fails for good.")

    @property
    def min_count(self) -> int:
        return self.replicas if self.min_replicas is None else self.min_replicas

    @property
    def max_count(self) -> int:
        return self.replicas if self.max_replicas is None else self.max_replicas


class ClusterTarget(SpecModel):
    """One cluster a job may place roles on."""

    name: str = Field(min_length=1)
    backend: Literal["kubernetes", "yarn"]
    context: str | None = Field(None, description="kubeconfig context (kubernetes).")
    kubeconfig: str | None = None
    namespace: str = "default"
    resource_manager: str | None = Field(None, description="YARN ResourceManager URL (yarn).")
    queue: str = "default"
    user: str | None = Field(
        None, description="YARN user (user.name of the REST calls; pseudo authentication). Default: the OS user."
    )
    python: str | None = Field(
        None,
        description="Python interpreter on the YARN nodes that runs the AM and the roles (the same environment "
        "at the same path). Default: the submitting process's interpreter.",
    )


class ResourcesSpec(SpecModel):
    backend: Backend = "local"
    namespace: str = "default"
    roles: dict[str, RoleSpec] = Field(min_length=1)
    clusters: list[ClusterTarget] = Field(default_factory=list)
