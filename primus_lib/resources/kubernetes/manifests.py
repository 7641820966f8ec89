"""Kubernetes objects for one PrimusJob, as plain dicts (what `kubectl apply` would take).

- trainer: an Indexed Job (servers >= INDEXED_JOB_MIN) or a PyTorchJob (when the Kubeflow CRD
  exists), plus a headless Service for torchrun's rendezvous (stable pod DNS names);
- other runnable roles (stream executors, parameter servers): a StatefulSet each;
- stream executors: a headless Service (the Flight port, named ``flight``) that is their StatefulSet's
  serviceName; the trainer lists its Endpoints (``primus_lib.resources.discovery``); a NetworkPolicy
  that admits to their pods only the job's trainer pods, on the Flight port; and the job's Flight
  token, a Secret ``<job>-flight`` the controller creates (and never reads back) and mounts into the
  executor and trainer pods at FLIGHT_TOKEN_FILE: every Flight call carries it
  (``primus_lib.data.flight_auth``);
- the job spec as a ConfigMap mounted at SPEC_MOUNT, so every pod reads the same PrimusJob.
Pods run as non-root with a read-only root filesystem, no privilege escalation and no capabilities.
No secret in an object: the PrimusJob and the ConfigMap carry ``spec.storage.database`` with its
password as ``${PRIMUS_DATABASE_PASSWORD}``, which the pods get from the Secret ``<job>-database``
(key ``password``, made by whoever deploys the job: the controller may not read Secrets).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from primus_lib.resources import roles as role_rules
from primus_lib.spec.crd import GROUP, PLURAL, VERSION
from primus_lib.spec.job import PrimusJob
from primus_lib.spec.resources import RoleSpec
from primus_lib.spec.units import format_cpu, format_memory

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
_QUERY_PASSWORD = re.compile(r"(?i)([?&]password=)[^&]*")


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
    return bool(url) and password_as_variable(url) != url


def public_document(job: PrimusJob) -> dict[str, Any]:
    """The job as JSON for the API server's objects: no database password in it."""
    body = job.model_dump(mode="json", exclude_none=True)
    storage = body["spec"].get("storage") or {}
    if storage.get("database"):
        storage["database"] = password_as_variable(storage["database"])
    return body


def labels(job: PrimusJob, role: str | None = None) -> dict[str, str]:
    out = {"app.kubernetes.io/name": "primus", "app.kubernetes.io/managed-by": "primus-controller", JOB_LABEL: job.name}
    if role is not None:
        out[ROLE_LABEL] = dns(role)
    return out


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
    env = [
        {"name": "PRIMUS_JOB", "value": literal(job.name)},
        {"name": "PRIMUS_ROLE", "value": literal(role)},
        {"name": "PRIMUS_REPLICAS", "value": str(spec.replicas)},
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
        "volumes": [{"name": "spec", "configMap": {"name": spec_configmap_name(job)}}, {"name": "tmp", "emptyDir": {}}],
    }
    if subdomain:
        pod["subdomain"] = subdomain
    flight_token_volume(job, role, pod, container)
    return {"metadata": {"labels": labels(job, role)}, "spec": pod}


def owner(owner_uid: str | None, job: PrimusJob) -> list[dict[str, Any]]:
    if not owner_uid:
        return []
    return [
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "PrimusJob",
            "name": job.name,
            "uid": owner_uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def meta(job: PrimusJob, name: str, role: str | None, owner_uid: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "labels": labels(job, role)}
    refs = owner(owner_uid, job)
    if refs:
        out["ownerReferences"] = refs
    return out


def quantities(change: dict[str, Any]) -> dict[str, Any]:
    """cpu/memory as Kubernetes quantity strings (the CRD's int-or-string fields reject 2.5)."""
    out = dict(change)
    if "cpu" in out:
        out["cpu"] = format_cpu(float(out["cpu"]))
    if "memory" in out:
        out["memory"] = format_memory(float(out["memory"]))
    return out


def primusjob_object(job: PrimusJob, namespace: str) -> dict[str, Any]:
    body = public_document(job)
    body["metadata"] = {"name": job.name, "namespace": namespace, "labels": dict(job.metadata.labels)}
    roles = body["spec"]["resources"]["roles"]
    for name in roles:
        roles[name] = quantities(roles[name])
    return body


def spec_configmap(job: PrimusJob, owner_uid: str | None = None) -> dict[str, Any]:
    text = yaml.safe_dump(public_document(job), sort_keys=False)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(job, spec_configmap_name(job), None, owner_uid),
        "data": {"job.yaml": text},
    }


def trainer_service(job: PrimusJob, owner_uid: str | None = None) -> dict[str, Any]:
    """Headless: each trainer pod gets a DNS name <pod-hostname>.<service> for the rendezvous."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(job, trainer_service_name(job), "trainer", owner_uid),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": labels(job, "trainer"),
            "ports": [{"name": "rdzv", "port": RDZV_PORT, "targetPort": RDZV_PORT}],
        },
    }


def executor_service(job: PrimusJob, owner_uid: str | None = None) -> dict[str, Any]:
    """Headless, ready addresses only: the Endpoints list the executors whose Flight server listens,
    each with its pod's hostname (``<statefulset>-<i>``: the executor's index) and IP."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(job, executor_service_name(job), EXECUTOR_ROLE, owner_uid),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": False,
            "selector": labels(job, EXECUTOR_ROLE),
            "ports": [{"name": FLIGHT_PORT_NAME, "port": FLIGHT_PORT, "targetPort": FLIGHT_PORT_NAME}],
        },
    }


def flight_secret(job: PrimusJob, token: str, owner_uid: str | None = None) -> dict[str, Any]:
    """The job's Flight token (``token``: fresh from ``secrets``), deleted with the PrimusJob."""
    metadata = meta(job, flight_secret_name(job), None, owner_uid)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": metadata,
        "stringData": {FLIGHT_TOKEN_KEY: token},
    }


def executor_network_policy(job: PrimusJob, owner_uid: str | None = None) -> dict[str, Any]:
    """Ingress to the job's executor pods only from the job's trainer pods, only on the Flight port
    (the kubelet's probes from the node pass, as for every NetworkPolicy)."""
    trainers = {"podSelector": {"matchLabels": {JOB_LABEL: job.name, ROLE_LABEL: dns(role_rules.TRAINER_ROLE)}}}
    ingress = [{"from": [trainers], "ports": [{"protocol": "TCP", "port": FLIGHT_PORT}]}]
    spec = {"podSelector": {"matchLabels": labels(job, EXECUTOR_ROLE)}, "policyTypes": ["Ingress"], "ingress": ingress}
    metadata = meta(job, executor_service_name(job), EXECUTOR_ROLE, owner_uid)
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": metadata, "spec": spec}


def replicas_patch(obj: dict, n: int) -> list[dict[str, Any]]:
    """JSON patch of a StatefulSet (as read, a dict): its replicas and $PRIMUS_REPLICAS in its pod
    template, the N each stream executor picks its partitions by (a template change: a rolling update)."""
    ops: list[dict[str, Any]] = [{"op": "replace", "path": "/spec/replicas", "value": n}]
    for i, var in enumerate(obj["spec"]["template"]["spec"]["containers"][0].get("env") or []):
        if var.get("name") == "PRIMUS_REPLICAS":
            ops.append({"op": "replace", "path": f"/spec/template/spec/containers/0/env/{i}/value", "value": str(n)})
    return ops


def trainer_job(
    job: PrimusJob, indexed: bool, owner_uid: str | None = None, replicas: int | None = None, cpu=None, memory=None
) -> dict[str, Any]:
    spec = job.spec.resources.roles["trainer"]
    n = spec.replicas if replicas is None else replicas
    template = pod_template(
        job,
        "trainer",
        "Never",
        cmd=command(job, "trainer", n, indexed) or [],
        cpu=cpu,
        memory=memory,
        subdomain=trainer_service_name(job),
    )
    body: dict[str, Any] = {
        "completions": n,
        "parallelism": n,
        "backoffLimit": spec.max_restarts * max(1, n),
        "template": template,
    }
    if indexed:
        body["completionMode"] = "Indexed"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta(job, workload_name(job, "trainer"), "trainer", owner_uid),
        "spec": body,
    }


def pytorch_job(
    job: PrimusJob, owner_uid: str | None = None, replicas: int | None = None, cpu=None, memory=None
) -> dict[str, Any]:
    """Kubeflow's PyTorchJob: the training operator sets MASTER_ADDR/RANK; one Master + n-1 Workers."""
    spec = job.spec.resources.roles["trainer"]
    n = spec.replicas if replicas is None else replicas
    cmd = (
        spec.command
        and command(job, "trainer")
        or ["torchrun", f"--nproc-per-node={max(1, spec.gpu)}", "-m", "primus_lib.cli.main", "train", SPEC_FILE]
    )
    template = pod_template(job, "trainer", "OnFailure", cmd=cmd, cpu=cpu, memory=memory)
    template["spec"]["containers"][0]["name"] = "pytorch"  # the training operator looks for this name
    replica_specs = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template}}
    if n > 1:
        replica_specs["Worker"] = {"replicas": n - 1, "restartPolicy": "OnFailure", "template": template}
    group, version, _ = PYTORCHJOB
    return {
        "apiVersion": f"{group}/{version}",
        "kind": "PyTorchJob",
        "metadata": meta(job, workload_name(job, "trainer"), "trainer", owner_uid),
        "spec": {
            "runPolicy": {"backoffLimit": spec.max_restarts * max(1, n), "cleanPodPolicy": "None"},
            "pytorchReplicaSpecs": replica_specs,
        },
    }


def statefulset(
    job: PrimusJob, role: str, owner_uid: str | None = None, replicas: int | None = None, cpu=None, memory=None
) -> dict[str, Any]:
    spec = job.spec.resources.roles[role]
    name = workload_name(job, role)
    n = spec.replicas if replicas is None else replicas
    template = pod_template(job, role, "Always", cmd=command(job, role) or [], cpu=cpu, memory=memory)
    for var in template["spec"]["containers"][0]["env"]:
        if var["name"] == "PRIMUS_REPLICAS":
            var["value"] = str(n)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": meta(job, name, role, owner_uid),
        "spec": {
            "replicas": n,
            "serviceName": name,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels(job, role)},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": template,
        },
    }


def kind_of(role: str) -> str:
    return "trainer" if role == role_rules.TRAINER_ROLE else "statefulset"


__all__ = ["GROUP", "PLURAL", "VERSION"]
