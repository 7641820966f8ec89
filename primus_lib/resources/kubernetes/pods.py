"""The pod a role runs in: its container command, environment, resources, security context and
mounts (the job spec, the Flight token, the job's connections and the database password from Secrets).

Every workload (``manifests.py``: the trainer's Job or PyTorchJob, a StatefulSet) wraps this
template; what a pod may do (non-root, read-only root filesystem, no capabilities, a service account
token only for the trainer that lists the executors' Endpoints) is decided here, once.
"""

from __future__ import annotations

import re
from typing import Any

from primus_lib.resources import roles as role_rules
from primus_lib.resources.kubernetes.names import (
    CONNECTIONS_MOUNT,
    DATABASE_PASSWORD_ENV,
    EXECUTOR_ROLE,
    FLIGHT_PORT,
    FLIGHT_PORT_NAME,
    FLIGHT_SECRET_MOUNT,
    RDZV_PORT,
    RUN_AS,
    SPEC_FILE,
    SPEC_MOUNT,
    WORKLOAD_SERVICE_ACCOUNT,
    connections_secret_name,
    database_secret_name,
    flight_secret_name,
    labels,
    spec_configmap_name,
    trainer_service_name,
)
from primus_lib.spec.job import PrimusJob
from primus_lib.spec.resources import RoleSpec
from primus_lib.spec.units import format_cpu, format_memory

_QUERY_PASSWORD = re.compile(r"(?i)([?&]password=)[^&]*")


def password_as_variable(url: str) -> str:
    """``url`` with its password (user info after ``:``, or ``password=``) as ``${PRIMUS_DATABASE_PASSWORD}``,
    which the spec loader expands in the pod (the last ``@`` ends the user info, as in the spec's mask)."""
    variable = "${" + DATABASE_PASSWORD_ENV + "}"
    head, sep, rest = url.partition("://")
    auth, at, host = rest.rpartition("@")
    if sep and at and ":" in auth:
        rest = auth.split(":", 1)[0] + ":" + variable + "@" + host
    return head + sep + _QUERY_PASSWORD.sub(lambda found: found.group(1) + variable, rest)


def has_database_password(job: PrimusJob) -> bool:
    url = job.spec.storage.database
    return url is not None and password_as_variable(url) != url


def resources(spec: RoleSpec, cpu: float | None = None, memory: float | None = None) -> dict[str, Any]:
    amounts = {
        "cpu": format_cpu(cpu if cpu is not None else spec.cpu),
        "memory": format_memory(memory if memory is not None else spec.memory),
    }
    limits = dict(amounts)
    if spec.gpu:
        limits["nvidia.com/gpu"] = str(spec.gpu)
    return {"requests": amounts, "limits": limits}


def pod_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def literal(value: str) -> str:
    """``value`` as a container gets it: the kubelet expands ``$(VAR)`` in a container's command and
    env values and turns ``$$`` into ``$``, so every ``$`` of a value from the spec is doubled."""
    return value.replace("$", "$$")


def command(job: PrimusJob, role: str, trainer_nodes: int = 1, indexed: bool = False) -> list[str] | None:
    """The container command: RoleSpec.command ({SPEC} -> the mounted spec; each element literal:
    exec form, no shell, no ``$(VAR)`` expansion), else the role's default."""
    spec = job.spec.resources.roles[role]
    if spec.command:
        return [literal(str(part).replace("{SPEC}", SPEC_FILE)) for part in spec.command]
    if role == role_rules.TRAINER_ROLE:
        rank = "$(JOB_COMPLETION_INDEX)" if indexed else "0"
        master = f"{job.name}-trainer-0.{trainer_service_name(job)}" if indexed else "127.0.0.1"
        return [
            "torchrun",
            f"--nnodes={trainer_nodes}",
            f"--nproc-per-node={max(1, spec.gpu)}",
            f"--node-rank={rank}",
            f"--master-addr={master}",
            f"--master-port={RDZV_PORT}",
            "-m",
            "primus_lib.cli.main",
            "train",
            SPEC_FILE,
        ]
    default = role_rules.default_command(role, SPEC_FILE)  # None when the subcommand does not exist
    if default is not None and role == EXECUTOR_ROLE:
        return executor_command()
    return None if default is None else ["primus", *default[3:]]


def executor_command() -> list[str]:
    """``primus executor``: index = the pod's ordinal (the tail of its name, ``<statefulset>-<i>``),
    N = $PRIMUS_REPLICAS (in the template: scale rolls the pods), Flight on FLIGHT_PORT, advertised
    at the pod's IP (POD_NAME, POD_IP: downward API). A shell computes the ordinal: valid on 1.20,
    where the ``apps.kubernetes.io/pod-index`` label (1.28+) does not exist."""
    script = (
        f'exec primus executor {SPEC_FILE} --index "${{POD_NAME##*-}}" --replicas "$PRIMUS_REPLICAS" '
        f'--host 0.0.0.0 --port {FLIGHT_PORT} --advertise "$POD_IP"'
    )
    return ["/bin/sh", "-c", script]


def reads_endpoints(job: PrimusJob, role: str) -> bool:
    """The trainer of a job with stream executors lists their Service's Endpoints: it gets its token
    (config/rbac: primus-workload may get endpoints, nothing else). Every other pod: no token."""
    executors = job.spec.resources.roles.get(EXECUTOR_ROLE)
    return (
        role == role_rules.TRAINER_ROLE and bool(executors and executors.replicas) and bool(command(job, EXECUTOR_ROLE))
    )


def has_executors(job: PrimusJob) -> bool:
    """The backend runs stream executors for this job (their Service, NetworkPolicy and token)."""
    spec = job.spec.resources.roles.get(EXECUTOR_ROLE)
    return spec is not None and command(job, EXECUTOR_ROLE) is not None


def connections_volume(job: PrimusJob) -> dict[str, Any]:
    """The job's connections Secret, owner- and group-readable (the pod's fsGroup); optional: a job
    whose submitter had no connections to hand runs with the SDKs' defaults (pod identity)."""
    return {"secretName": connections_secret_name(job), "defaultMode": 0o440, "optional": True}


def flight_token_volume(job: PrimusJob, role: str, pod: dict[str, Any], container: dict[str, Any]) -> None:
    """Mount the job's Flight token into the pods that speak Flight (its executors and its trainer)."""
    if role not in (EXECUTOR_ROLE, role_rules.TRAINER_ROLE) or not has_executors(job):
        return
    secret = {"secretName": flight_secret_name(job), "defaultMode": 0o440}  # group: the pod's fsGroup
    pod["volumes"].append({"name": "flight-token", "secret": secret})
    container["volumeMounts"].append({"name": "flight-token", "mountPath": FLIGHT_SECRET_MOUNT, "readOnly": True})


def pod_template(
    job: PrimusJob, role: str, restart: str, *, cmd: list[str], cpu=None, memory=None, subdomain: str | None = None
) -> dict[str, Any]:
    spec = job.spec.resources.roles[role]
    env: list[dict[str, Any]] = [
        {"name": "PRIMUS_JOB", "value": literal(job.name)},
        {"name": "PRIMUS_ROLE", "value": literal(role)},
        {"name": "PRIMUS_REPLICAS", "value": str(spec.replicas)},
        {"name": "PRIMUS_SECRETS_DIR", "value": CONNECTIONS_MOUNT},
    ]
    if has_database_password(job):  # the kubelet resolves it: the controller never reads the Secret
        ref = {"name": database_secret_name(job), "key": "password"}
        env.append({"name": DATABASE_PASSWORD_ENV, "valueFrom": {"secretKeyRef": ref}})
    container = {
        "name": "main",
        "image": spec.image or "primus:latest",
        "command": cmd,
        "env": env,
        "resources": resources(spec, cpu, memory),
        "securityContext": container_security(),
        "volumeMounts": [
            {"name": "spec", "mountPath": SPEC_MOUNT, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "connections", "mountPath": CONNECTIONS_MOUNT, "readOnly": True},
        ],
    }
    if role == role_rules.TRAINER_ROLE:
        container["ports"] = [{"name": "rdzv", "containerPort": RDZV_PORT}]
    if role == EXECUTOR_ROLE:  # Ready (-> listed in the Endpoints) once Flight listens
        env += [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ]
        container["ports"] = [{"name": FLIGHT_PORT_NAME, "containerPort": FLIGHT_PORT}]
        container["readinessProbe"] = {"tcpSocket": {"port": FLIGHT_PORT_NAME}, "periodSeconds": 5}
    pod: dict[str, Any] = {
        "restartPolicy": restart,
        "serviceAccountName": WORKLOAD_SERVICE_ACCOUNT,
        "automountServiceAccountToken": reads_endpoints(job, role),
        "securityContext": pod_security(),
        "containers": [container],
        "volumes": [
            {"name": "spec", "configMap": {"name": spec_configmap_name(job)}},
            {"name": "tmp", "emptyDir": {}},
            {"name": "connections", "secret": connections_volume(job)},
        ],
    }
    if subdomain:
        pod["subdomain"] = subdomain
    flight_token_volume(job, role, pod, container)
    return {"metadata": {"labels": labels(job, role)}, "spec": pod}
