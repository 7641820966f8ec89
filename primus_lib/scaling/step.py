"""One scaling step for a job: what the Airflow scaler sensor (or `primus`, or a cron) runs between
windows. Batch data executors scale through the job's Airflow pool (horizontal) and the
executor_config the DAG's mapped tasks read (vertical: scaling/resources.json); stream executors
scale and resize through the resource backend."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry

from primus_lib.allocation import allocations_dir, record_allocation, role_resources
from primus_lib.metrics.readers import (
    MetricsReader,
    PrometheusEndpoint,
    PrometheusReader,
    RegistryReader,
    TextfileReader,
    has_snapshots,
)
from primus_lib.paths import JobPaths
from primus_lib.scaling.base import Decision
from primus_lib.scaling.manager import Actuator, BackendActuator, ScalingManager
from primus_lib.scaling.store import ScalingStore
from primus_lib.spec.job import PrimusJob

BATCH_ROLE, STREAM_ROLE = "data_executor", "stream_executor"


class _StoreOnly:
    """Vertical decisions need no call: the manager stores them where the mapped tasks read them."""

    def apply(self, decision: Decision) -> None:
        return None


def reader_for(
    job: PrimusJob, role: str, prometheus: str | PrometheusEndpoint | None, registry: CollectorRegistry = REGISTRY
) -> MetricsReader:
    """Prometheus when given (a URL, or an endpoint with its login); else the snapshots in the job's
    metrics dir (executors and trainers in other processes); else this process's registry."""
    if prometheus:
        return PrometheusReader(prometheus, job.name, role)
    metrics_dir = JobPaths.for_job(job).metrics_dir
    if has_snapshots(metrics_dir):
        return TextfileReader(job.name, metrics_dir, role)
    return RegistryReader(job.name, role, registry)


def scaling_step(
    job: PrimusJob,
    *,
    prometheus: str | PrometheusEndpoint | None = None,
    pool_actuator: Actuator | None = None,
    backend=None,
    registry: CollectorRegistry = REGISTRY,
) -> list[Decision]:
    """Tick the manager of each scaled role once; returns the decisions applied (at most one per role)."""
    roles = job.spec.resources.roles
    decisions: list[Decision] = []
    if BATCH_ROLE in roles:
        actuator = pool_actuator or _StoreOnly()
        store = ScalingStore(allocations_dir(job) / BATCH_ROLE)
        manager = ScalingManager(
            job,
            reader_for(job, BATCH_ROLE, prometheus, registry),
            actuator,
            role=BATCH_ROLE,
            store=store,
            registry=registry,
        )
        decision = manager.tick()
        if decision is not None:
            _share_resources(job, decision)
            decisions.append(decision)
    if STREAM_ROLE in roles and backend is not None:
        store = ScalingStore(allocations_dir(job) / STREAM_ROLE)
        manager = ScalingManager(
            job,
            reader_for(job, STREAM_ROLE, prometheus, registry),
            BackendActuator(backend),
            role=STREAM_ROLE,
            store=store,
            registry=registry,
        )
        decision = manager.tick()
        if decision is not None:
            decisions.append(decision)
    return decisions


def _share_resources(job: PrimusJob, decision: Decision) -> None:
    """Mirror the role's resources to scaling/resources.json, where role_resources() reads them."""
    if decision.action == "resize":  # a part it leaves None is unchanged (as for the backend's resize)
        cpu, memory = role_resources(job, decision.role)
        cpu = decision.cpu if decision.cpu is not None else cpu
        memory = decision.memory if decision.memory is not None else memory
        record_allocation(allocations_dir(job), decision.role, cpu, memory)
