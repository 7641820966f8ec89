"""Cluster policy: size a Primus data task's worker pod when the KubernetesExecutor creates it.

The DAG's ``executor_config`` (a ``pod_override`` with the role's requests/limits) is computed
when the DAG file is parsed, so it lags a vertical decision of the scaler until the next parse.
``pod_mutation_hook`` runs where Airflow decides the pod (``PodGenerator.construct_pod``, called
by the KubernetesExecutor in the scheduler): for a pod marked by ``mark_pod_override`` it reads
the role's current allotment (``resources.json`` with the job's shared state, s3:// or
webhdfs:// included, via ``primus_lib.allocation``) and sets the base container's requests and
limits.

Installed with the package: Airflow loads the ``airflow.policy`` entry point (pyproject.toml) in
every one of its processes at start (a deployment's own ``airflow_local_settings`` hook of the
same name runs as well: pluggy calls every implementation). That start is also where imports get
cheap (``warm_imports``), because Airflow forks the processes that do the work:
- the DAG processor forks one process per DAG file, so the job-spec model (whose validators
  pydantic builds at import) and the operators are paid once per DAG processor instead of once
  per generated DAG file (bench/dag_parse.py);
- a task runs in a fork of its worker (the Task SDK's supervisor ``os.fork``s; LocalExecutor's
  workers are forks of the scheduler, a Celery worker forks each task), so in those processes the
  data task's and the Joiner's modules (pyarrow, the ledger's SQLAlchemy: 0.35-0.45 s a process)
  are loaded too, once per worker instead of once per data task (bench/executor.py). Only there:
  they add about 90 MiB of private memory to a process, which the forks share until they write.
  A KubernetesExecutor pod starts afresh and inherits nothing.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import TYPE_CHECKING, Any

from airflow.policies import hookimpl

if TYPE_CHECKING:
    from kubernetes.client import models as k8s

    from primus_lib.spec import PrimusJob

ROLE_ANNOTATION = "primus.dev/role"
ALLOCATIONS_ANNOTATION = "primus.dev/allocations"  # the directory of the job's resources.json
CONNECTION_ANNOTATION = "primus.dev/storage-connection"  # spec.storage.connection_id, when set
BASE_CONTAINER = "base"  # the KubernetesExecutor's task container

log = logging.getLogger(__name__)


def mark_pod_override(config: dict[str, Any], job: PrimusJob, role: str = "data_executor") -> dict[str, Any]:
    """Annotate the ``pod_override`` of ``config`` so the policy knows whose allotment to apply.

    The annotations hold the allocations directory (a local path or an s3:// / webhdfs:// URI)
    and the name of the storage connection, never credentials, so the scheduler needs neither
    the spec file nor its ``${VAR}`` values.
    """
    from kubernetes.client import models as k8s

    from primus_lib.allocation import allocations_dir

    pod = config.get("pod_override")
    if pod is None:
        return config
    pod.metadata = pod.metadata or k8s.V1ObjectMeta()
    pod.metadata.annotations = {
        **(pod.metadata.annotations or {}),
        ROLE_ANNOTATION: role,
        ALLOCATIONS_ANNOTATION: str(allocations_dir(job)),
    }
    if job.spec.storage.connection_id:
        pod.metadata.annotations[CONNECTION_ANNOTATION] = job.spec.storage.connection_id
    return config


@hookimpl
def pod_mutation_hook(pod: k8s.V1Pod) -> None:
    """Set a marked pod's base container to the role's current CPU/memory; others pass unchanged.

    The store is read with the storage connection's settings (``spec.storage.connection_id``),
    else the default storage connection (``primus_storage_default``), else the SDK's defaults. A store that cannot be read (or a broken
    resources.json, a missing connection) keeps the parse-time sizing and logs one warning: a
    stale size is better than a task that cannot start.
    """
    annotations = (pod.metadata.annotations or {}) if pod.metadata else {}
    role, where = annotations.get(ROLE_ANNOTATION), annotations.get(ALLOCATIONS_ANNOTATION)
    if not role or not where:
        return
    from primus_lib.allocation import read_allocations
    from primus_lib.storage import locate
    from primus_operators.hooks.storage import PrimusStorageHook

    connection = annotations.get(CONNECTION_ANNOTATION)
    try:
        credentials = PrimusStorageHook(connection).credentials() if connection else None
        decided = read_allocations(locate(where, credentials)).get(role)
    except Exception as exc:  # never stop the pod: its parse-time size stands
        log.warning(
            "primus: pod %s keeps its parse-time resources (%s: %s)", pod.metadata.name, type(exc).__name__, exc
        )
        return
    if decided:
        set_resources(pod, float(decided["cpu"]), float(decided["memory"]))


def set_resources(pod: k8s.V1Pod, cpu: float, memory: float) -> None:
    """requests = limits = (cpu, memory) on the base container; other resources (GPUs) are kept."""
    from kubernetes.client import models as k8s

    from primus_lib.spec.units import format_cpu, format_memory

    sized = {"cpu": format_cpu(cpu), "memory": format_memory(memory)}
    for container in pod.spec.containers if pod.spec else []:
        if container.name != BASE_CONTAINER:
            continue
        current = container.resources or k8s.V1ResourceRequirements()
        container.resources = k8s.V1ResourceRequirements(
            requests={**(current.requests or {}), **sized},
            limits={**(current.limits or {}), **sized},
            claims=current.claims,
        )


# What every Primus DAG file imports, and what a data task or the Joiner adds when it runs.
PARSE_MODULES = ("primus_lib.spec", "primus_operators.operators")
TASK_MODULES = ("primus_lib.data.task", "primus_lib.data.executor.task", "primus_lib.data.executor.join")
# The Airflow commands whose forks run tasks: ``airflow scheduler`` (LocalExecutor) and
# ``airflow celery worker``.
TASK_FORKING_COMMANDS = (("scheduler",), ("celery", "worker"))


def forks_tasks(argv: list[str]) -> bool:
    """This process is an Airflow command whose forks run tasks (``argv``: its ``sys.argv``)."""
    return any(tuple(argv[1 : 1 + len(command)]) == command for command in TASK_FORKING_COMMANDS)


def warm_imports(argv: list[str] | None = None) -> None:
    """Import what this Airflow process's forks will need; a broken install must not stop Airflow
    itself (each DAG file or task then reports the import error where users look for it)."""
    modules = PARSE_MODULES + (TASK_MODULES if forks_tasks(sys.argv if argv is None else argv) else ())
    try:
        for module in modules:
            importlib.import_module(module)
    except Exception as exc:
        log.warning("primus: imports not pre-warmed (%s: %s)", type(exc).__name__, exc)


warm_imports()
