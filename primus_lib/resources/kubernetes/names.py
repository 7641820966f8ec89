"""The names every Kubernetes object of a PrimusJob is found by: its workloads, Services, ConfigMap
and Secrets, the labels that select its pods, and the fixed ports, mounts and accounts they share.

Kept apart from the objects (``manifests.py``) and their pods (``pods.py``) because the backend,
discovery and capacity look objects up by these names without building any.
"""

from __future__ import annotations

from primus_lib.spec.job import PrimusJob

INDEXED_JOB_MIN = (1, 22)  # completionMode: Indexed is beta (on by default) from 1.22; alpha in 1.21
SPEC_MOUNT = "/etc/primus"
SPEC_FILE = f"{SPEC_MOUNT}/job.yaml"
RDZV_PORT = 29400
RUN_AS = 1000
WORKLOAD_SERVICE_ACCOUNT = "primus-workload"
JOB_LABEL, ROLE_LABEL = "primus.dev/job", "primus.dev/role"
PYTORCHJOB = ("kubeflow.org", "v1", "pytorchjobs")
EXECUTOR_ROLE = "stream_executor"
FLIGHT_PORT = 8815  # every stream executor pod serves Arrow Flight here
FLIGHT_PORT_NAME = "flight"
FLIGHT_SECRET_MOUNT, FLIGHT_TOKEN_KEY = "/etc/primus-flight", "token"
FLIGHT_TOKEN_FILE = f"{FLIGHT_SECRET_MOUNT}/{FLIGHT_TOKEN_KEY}"
DATABASE_PASSWORD_ENV = "PRIMUS_DATABASE_PASSWORD"
CONNECTIONS_MOUNT = "/etc/primus-connections"  # $PRIMUS_SECRETS_DIR in every pod: <connection id>.json files


def dns(name: str) -> str:
    return name.replace("_", "-").lower()


def workload_name(job: PrimusJob, role: str) -> str:
    return f"{job.name}-{dns(role)}"


def trainer_service_name(job: PrimusJob) -> str:
    return f"{job.name}-trainer"


def executor_service_name(job: PrimusJob) -> str:
    """The stream executors' headless Service, also their StatefulSet's serviceName."""
    return workload_name(job, EXECUTOR_ROLE)


def spec_configmap_name(job: PrimusJob) -> str:
    return f"{job.name}-spec"


def database_secret_name(job: PrimusJob) -> str:
    return f"{job.name}-database"


def flight_secret_name(job: PrimusJob) -> str:
    return f"{job.name}-flight"


def connections_secret_name(job: PrimusJob) -> str:
    return f"{job.name}-connections"


def labels(job: PrimusJob, role: str | None = None) -> dict[str, str]:
    out = {"app.kubernetes.io/name": "primus", "app.kubernetes.io/managed-by": "primus-controller", JOB_LABEL: job.name}
    if role is not None:
        out[ROLE_LABEL] = dns(role)
    return out
