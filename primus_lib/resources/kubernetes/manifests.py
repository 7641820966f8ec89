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
- the job spec as a ConfigMap mounted at SPEC_MOUNT, so every pod reads the same PrimusJob;
- the connections the spec names, as the submitter resolved them (Airflow's connections in a task),
  in a Secret ``<job>-connections`` (one ``<id>.json`` key each, Airflow's connection JSON) that every
  pod mounts at CONNECTIONS_MOUNT, its ``$PRIMUS_SECRETS_DIR`` (``primus_lib.credentials``).
Pods run as non-root with a read-only root filesystem, no privilege escalation and no capabilities.
No secret in an object: the PrimusJob and the ConfigMap carry ``spec.storage.database`` with its
password as ``${PRIMUS_DATABASE_PASSWORD}``, which the pods get from the Secret ``<job>-database``
(key ``password``, made by whoever deploys the job: the controller may not read Secrets).
Every workload's pod is ``pods.py``'s template; every object's name and labels are ``names.py``'s.
"""

from __future__ import annotations

from typing import Any

import yaml

from primus_lib.credentials import Connection
from primus_lib.resources import roles as role_rules
from primus_lib.resources.kubernetes.names import (
    EXECUTOR_ROLE,
    FLIGHT_PORT,
    FLIGHT_PORT_NAME,
    FLIGHT_TOKEN_KEY,
    JOB_LABEL,
    PYTORCHJOB,
    RDZV_PORT,
    ROLE_LABEL,
    SPEC_FILE,
    connections_secret_name,
    dns,
    executor_service_name,
    flight_secret_name,
    labels,
    spec_configmap_name,
    trainer_service_name,
    workload_name,
)
from primus_lib.resources.kubernetes.pods import command, password_as_variable, pod_template
from primus_lib.spec.crd import GROUP, PLURAL, VERSION
from primus_lib.spec.job import PrimusJob
from primus_lib.spec.units import format_cpu, format_memory


def public_document(job: PrimusJob) -> dict[str, Any]:
    """The job as JSON for the API server's objects: no database password in it."""
    body = job.model_dump(mode="json", exclude_none=True)
    storage = body["spec"].get("storage") or {}
    if storage.get("database"):
        storage["database"] = password_as_variable(storage["database"])
    return body


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


def connections_secret(job: PrimusJob, connections: list[Connection], owner_uid: str | None = None) -> dict[str, Any]:
    """The connections the job's pods read as secret files; created once per job and never read back
    (to rotate: delete it, the next submit writes the current ones, the kubelet refreshes the files)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": meta(job, connections_secret_name(job), None, owner_uid),
        "stringData": {f"{conn.conn_id}.json": conn.as_json() for conn in connections},
    }


def executor_network_policy(job: PrimusJob, owner_uid: str | None = None) -> dict[str, Any]:
    """Ingress to the job's executor pods only from the job's trainer pods, only on the Flight port
    (the kubelet's probes from the node pass, as for every NetworkPolicy)."""
    trainers = {"podSelector": {"matchLabels": {JOB_LABEL: job.name, ROLE_LABEL: dns(role_rules.TRAINER_ROLE)}}}
    ingress = [{"from": [trainers], "ports": [{"protocol": "TCP", "port": FLIGHT_PORT}]}]
    spec = {"podSelector": {"matchLabels": labels(job, EXECUTOR_ROLE)}, "policyTypes": ["Ingress"], "ingress": ingress}
    metadata = meta(job, executor_service_name(job), EXECUTOR_ROLE, owner_uid)
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": metadata, "spec": spec}


def trainer_network_policy(job: PrimusJob, owner_uid: str | None = None) -> dict[str, Any]:
    """Ingress to the job's trainer pods only from each other: torchrun's rendezvous store and the
    gloo/NCCL collectives (ports of their own choosing) ask no login, so only the job's own ranks may
    reach them (the kubelet's probes from the node pass, as for every NetworkPolicy)."""
    trainers = {"podSelector": {"matchLabels": labels(job, role_rules.TRAINER_ROLE)}}
    spec: dict[str, Any] = {"podSelector": trainers["podSelector"], "policyTypes": ["Ingress"]}
    spec["ingress"] = [{"from": [trainers]}]
    metadata = meta(job, trainer_service_name(job), role_rules.TRAINER_ROLE, owner_uid)
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
