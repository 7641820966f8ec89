"""Resource scheduling: one controller interface (ResourceBackend) over local processes,
Kubernetes and YARN, with multi-cluster placement. Entry points: ``backend_for`` and
``ensure_running``."""

from __future__ import annotations

from primus_lib.resources.base import JobStatus, ResourceBackend, ResourceError, RoleStatus
from primus_lib.spec.job import PrimusJob

__all__ = [
    "JobStatus",
    "ResourceBackend",
    "ResourceError",
    "RoleStatus",
    "backend_for",
    "ensure_running",
    "job_failure",
]


def backend_for(job: PrimusJob, spec_path: str | None = None) -> ResourceBackend:
    """The backend the spec names (spec.resources.backend); several clusters -> the placing controller."""
    resources = job.spec.resources
    if resources.backend == "local":
        from primus_lib.resources.local import LocalBackend

        return LocalBackend(job, spec_path)
    if resources.clusters:
        from primus_lib.resources.multicluster import MultiClusterBackend

        return MultiClusterBackend(job, spec_path)
    if resources.backend == "kubernetes":
        from primus_lib.resources.kubernetes.backend import KubernetesBackend

        return KubernetesBackend(job, spec_path)
    if resources.backend == "yarn":
        raise ResourceError(
            f"job {job.name!r}: backend 'yarn' needs spec.resources.clusters with a resource_manager URL"
        )
    raise ResourceError(f"job {job.name!r}: unknown backend {resources.backend!r}")


def ensure_running(job: PrimusJob, spec_path: str | None = None) -> JobStatus:
    """Idempotent start: reattach to what runs, submit what does not, never duplicate."""
    return backend_for(job, spec_path).ensure_running()


def job_failure(spec_path: str) -> str | None:
    """Why the job of ``spec_path`` failed, or None while it has not: a read of its status that
    starts nothing. Whoever waits on the trainer (the Airflow trigger) ends with this message
    instead of waiting for a window a failed job will never consume."""
    from primus_lib.spec import load_job

    job = load_job(spec_path)
    status = backend_for(job, spec_path).status()
    return (status.message or f"job {job.name!r} failed") if status.phase == "Failed" else None
